//! The `image` stage: decode (raw HWC `uint8`, PNG, JPEG), seeded augmentation, and output
//! as `fixed_size_list<float32>` in CHW order.
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
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Float32Array, RecordBatch,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, SchemaRef, UInt8Type};
use chacha20::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::Transform;
use super::augment::row_ids;
use super::pixels;
use crate::batch::Batch;
use crate::config::{
    DeadLetterConfig, EraseValue, ImageConfig, ImageFormat, ImageOp, OnError, PadFill, PaddingMode,
};
use crate::dead_letter::DeadLetterFiles;
use crate::error::{Error, Result, StageRef};
use crate::runtime::recycle::F32Pool;

/// A built `image` stage.
#[derive(Debug)]
pub(crate) struct ImageStage {
    stage: StageRef,
    input: usize,
    output: usize,
    /// Replace the input column (else append).
    replace: bool,
    format: ImageFormat,
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

/// Free output buffers the stage keeps for reuse (about ten batches of 256 CIFAR images).
const RETAIN_BYTES: usize = 32 << 20;

/// Checks the config against the input schema; returns the stage and its output schema.
pub(crate) fn build(
    stage: &StageRef,
    c: &ImageConfig,
    input: &SchemaRef,
    ctx: &super::BuildContext,
) -> Result<(ImageStage, SchemaRef)> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
    let i = super::column_index(stage, input, &c.column)?;
    let t = input.field(i).data_type();
    let u8_list = matches!(t, DataType::FixedSizeList(f, _) if f.data_type() == &DataType::UInt8);
    if !(u8_list
        || matches!(
            t,
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        ))
    {
        return Err(err(format!(
            "column `{}` is {t}; image needs binary, fixed_size_binary or fixed_size_list<uint8> bytes",
            c.column
        )));
    }
    if u8_list && c.format != ImageFormat::Raw {
        return Err(err(format!(
            "column `{}` holds uint8 pixels (a list); use `format: raw`",
            c.column
        )));
    }
    let [h, w, ch] = c.shape;
    if h == 0 || w == 0 || !(ch == 1 || ch == 3) {
        return Err(err(format!(
            "`shape` is [height, width, channels] with channels 1 or 3, not {:?}",
            c.shape
        )));
    }
    if let (DataType::FixedSizeBinary(n) | DataType::FixedSizeList(_, n), ImageFormat::Raw) =
        (t, c.format)
        && *n as usize != h * w * ch
    {
        return Err(err(format!(
            "column `{}` holds {n} bytes per row but shape {:?} needs {}",
            c.column,
            c.shape,
            h * w * ch
        )));
    }
    let mut out_hw = [h, w];
    let mut crops = 0;
    let mut scale = vec![1.0f32 / 255.0; ch];
    let mut bias = vec![0.0f32; ch];
    let mut fill = vec![0.0f32; ch];
    // Each op applies once, in its phase (`ImageOp::phase`): a list naming one twice, or in
    // another order, would be applied otherwise than it reads, so it is refused.
    // Every problem of the ops is reported at once (each op's own checks stop at its
    // first).
    let mut problems: Vec<String> = Vec::new();
    if let Some(twice) = c.ops.iter().enumerate().find_map(|(k, op)| {
        c.ops[..k]
            .iter()
            .any(|o| o.name() == op.name())
            .then_some(op)
    }) {
        problems.push(format!(
            "`{}` is listed twice: give it once (each op applies once)",
            twice.name()
        ));
    }
    if let Some((before, after)) = c.ops.iter().enumerate().find_map(|(k, op)| {
        c.ops[..k]
            .iter()
            .find(|o| o.phase() > op.phase())
            .map(|o| (o, op))
    }) {
        problems.push(format!(
            "`{}` is listed after `{}`, but the ops apply in this order: the geometry (a crop or resize, flips), then color_jitter, random_grayscale (on the cut window, padding included), normalize (pixels to the model's scale), random_erasing (on the normalized output); list them in that order",
            after.name(),
            before.name()
        ));
    }
    for op in &c.ops {
        let mut check = || -> std::result::Result<(), String> {
            let err = |m: String| m;
            match op {
                ImageOp::RandomCrop {
                    size,
                    padding,
                    padding_mode,
                    pad_if_needed,
                    fill: PadFill(values),
                } => {
                    crops += 1;
                    if size[0] == 0 || size[1] == 0 {
                        return Err(err("random_crop: `size` must be positive".into()));
                    }
                    if !pad_if_needed && (size[0] > h + 2 * padding || size[1] > w + 2 * padding) {
                        return Err(err(format!(
                            "random_crop: size {size:?} is larger than the padded image ({}×{}); set `pad_if_needed: true` to pad it up to the size",
                            h + 2 * padding,
                            w + 2 * padding
                        )));
                    }
                    if values.len() != 1 && values.len() != ch {
                        return Err(err(format!(
                            "random_crop: `fill` has {} values; give one, or one per channel ({ch})",
                            values.len()
                        )));
                    }
                    if let Some(bad) = values.iter().find(|v| !(0.0..=255.0).contains(*v)) {
                        return Err(err(format!(
                            "random_crop: `fill` is in pixel values, 0 to 255, not {bad}"
                        )));
                    }
                    if *padding_mode != PaddingMode::Constant && values.iter().any(|v| *v != 0.0) {
                        return Err(err(format!(
                            "random_crop: `fill` is what `constant` padding holds; with `padding_mode: {}` the padding repeats the image, so leave `fill` out",
                            format!("{padding_mode:?}").to_lowercase()
                        )));
                    }
                    fill = (0..ch).map(|k| values[k % values.len()]).collect();
                    out_hw = *size;
                }
                ImageOp::RandomResizedCrop { size, scale, ratio } => {
                    crops += 1;
                    if size[0] == 0 || size[1] == 0 {
                        return Err(err("random_resized_crop: `size` must be positive".into()));
                    }
                    if !(0.0 < scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
                        return Err(err(format!(
                            "random_resized_crop: `scale` must satisfy 0 < min ≤ max ≤ 1, not {scale:?}"
                        )));
                    }
                    if !(0.0 < ratio[0] && ratio[0] <= ratio[1]) {
                        return Err(err(format!(
                            "random_resized_crop: `ratio` must satisfy 0 < min ≤ max, not {ratio:?}"
                        )));
                    }
                    out_hw = *size;
                }
                ImageOp::CenterCrop { size } | ImageOp::Resize { size } => {
                    crops += 1;
                    if size[0] == 0 || size[1] == 0 {
                        return Err(err(format!(
                            "{}: `size` must be positive",
                            if matches!(op, ImageOp::Resize { .. }) {
                                "resize"
                            } else {
                                "center_crop"
                            }
                        )));
                    }
                    out_hw = *size;
                }
                ImageOp::HorizontalFlip { p } | ImageOp::VerticalFlip { p } => {
                    if !(0.0..=1.0).contains(p) {
                        return Err(err(format!("flip: `p` must be in [0, 1], not {p}")));
                    }
                }
                ImageOp::ColorJitter {
                    brightness,
                    contrast,
                    saturation,
                    hue,
                } => {
                    for (name, v) in [
                        ("brightness", brightness),
                        ("contrast", contrast),
                        ("saturation", saturation),
                    ] {
                        if !(0.0..1.0).contains(v) {
                            return Err(err(format!(
                                "color_jitter: `{name}` must be in [0, 1), not {v}"
                            )));
                        }
                    }
                    if !(0.0..=0.5).contains(hue) {
                        return Err(err(format!(
                            "color_jitter: `hue` must be in [0, 0.5], not {hue}"
                        )));
                    }
                    if (*saturation > 0.0 || *hue > 0.0) && ch != 3 {
                        return Err(err(
                            "color_jitter: `saturation` and `hue` need 3 channels".into()
                        ));
                    }
                }
                ImageOp::RandomGrayscale { p } => {
                    if !(0.0..=1.0).contains(p) {
                        return Err(err(format!(
                            "random_grayscale: `p` must be in [0, 1], not {p}"
                        )));
                    }
                    if ch != 3 {
                        return Err(err("random_grayscale needs 3 channels".into()));
                    }
                }
                ImageOp::RandomErasing {
                    p,
                    scale,
                    ratio,
                    value,
                } => {
                    if !(0.0..=1.0).contains(p) {
                        return Err(err(format!(
                            "random_erasing: `p` must be in [0, 1], not {p}"
                        )));
                    }
                    if !(0.0 < scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
                        return Err(err(format!(
                            "random_erasing: `scale` must satisfy 0 < min ≤ max ≤ 1, not {scale:?}"
                        )));
                    }
                    if !(0.0 < ratio[0] && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
                        return Err(err(format!(
                            "random_erasing: `ratio` must satisfy 0 < min ≤ max, not {ratio:?}"
                        )));
                    }
                    if let EraseValue::Values(v) = value {
                        if v.len() != 1 && v.len() != ch {
                            return Err(err(format!(
                                "random_erasing: `value` has {} values; give one, or one per channel ({ch})",
                                v.len()
                            )));
                        }
                        if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
                            return Err(err(format!(
                                "random_erasing: `value` must be finite numbers, not {bad}"
                            )));
                        }
                    }
                }
                ImageOp::Normalize { mean, std } => {
                    if mean.len() != ch || std.len() != ch {
                        return Err(err(format!(
                            "normalize: give one `mean` and one `std` per channel ({ch})"
                        )));
                    }
                    if std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
                        return Err(err("normalize: every `std` must be positive".into()));
                    }
                    for k in 0..ch {
                        scale[k] = (1.0 / (255.0 * std[k])) as f32;
                        bias[k] = (-mean[k] / std[k]) as f32;
                    }
                }
            }
            Ok(())
        };
        if let Err(problem) = check() {
            problems.push(problem);
        }
    }
    if crops > 1 {
        problems.push(
            "at most one crop (random_crop, random_resized_crop, center_crop or resize)".into(),
        );
    }
    match problems.len() {
        0 => {}
        1 => return Err(err(problems.remove(0))),
        n => {
            let listed: Vec<String> = problems
                .iter()
                .enumerate()
                .map(|(i, p)| format!("({}) {p}", i + 1))
                .collect();
            return Err(err(format!("{n} problems in `ops`: {}", listed.join("; "))));
        }
    }
    let dead_letter = match &c.dead_letter {
        None => None,
        Some(_) if c.on_error != OnError::Skip => {
            return Err(err(
                "`dead_letter` takes the rows `on_error: skip` removes: set `on_error: skip` too"
                    .into(),
            ));
        }
        Some(DeadLetterConfig::Kafka(_)) => {
            return Err(err(
                "an image stage writes its dead letters to files: `dead_letter: {type: file, path: …}`"
                    .into(),
            ));
        }
        Some(DeadLetterConfig::File(f)) => Some(ImageDeadLetter {
            files: std::sync::Mutex::new(DeadLetterFiles::open(f, &ctx.base_dir, ctx.rank)?),
            runtime: tokio::runtime::Handle::try_current().map_err(|e| {
                Error::Internal(format!("{stage}: a dead letter needs a tokio runtime: {e}"))
            })?,
        }),
    };
    let out_name = c.output.clone().unwrap_or_else(|| c.column.clone());
    let out_type = DataType::FixedSizeList(
        Arc::new(Field::new_list_field(DataType::Float32, false)),
        (ch * out_hw[0] * out_hw[1]) as i32,
    );
    let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
    let (output, replace) = if out_name == c.column {
        fields[i] = Field::new(&out_name, out_type, false);
        (i, true)
    } else {
        if input.index_of(&out_name).is_ok() {
            return Err(err(format!("output column `{out_name}` already exists")));
        }
        fields.push(Field::new(&out_name, out_type, false));
        (fields.len() - 1, false)
    };
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    Ok((
        ImageStage {
            stage: stage.clone(),
            input: i,
            output,
            replace,
            format: c.format,
            shape: c.shape,
            out_hw,
            ops: c.ops.clone(),
            key: super::augment::column_key(c.seed, stage.index, &c.column),
            on_error: c.on_error,
            schema: schema.clone(),
            dead_letter,
            pad_value: (0..ch).map(|k| fill[k] * scale[k] + bias[k]).collect(),
            fill,
            scale,
            bias,
            buffers: F32Pool::new(RETAIN_BYTES),
        },
        schema,
    ))
}

/// Where output pixels come from: a crop window of the (zero-padded) source, resized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Geometry {
    /// Top-left of the window in source coordinates (may be negative: padding).
    pub top: f64,
    pub left: f64,
    /// Window size in source pixels.
    pub height: f64,
    pub width: f64,
    pub flip_h: bool,
    pub flip_v: bool,
    /// Integer window without resizing (exact pixel copy).
    pub exact: bool,
    /// What the window reads outside the image (exact windows).
    pub pad: PaddingMode,
    /// Per axis (rows, columns): `random_crop`'s `padding`, and what `pad_if_needed` added
    /// around that padded image (padded in turn, as torchvision pads twice).
    pub inner: [usize; 2],
    pub outer: [usize; 2],
}

/// The weights of one axis of an antialiased bilinear resize, as PyTorch computes them for
/// `_upsample_bilinear2d_aa` (torchvision's `resize(antialias=True)`; PIL's bilinear filter):
/// output `i` of `out` centred at `scale · (i + 0.5)` (`scale = input / out`) averages the input
/// samples within `max(scale, 1)` of it, weighted by a triangle `max(0, 1 − |d| / max(scale,
/// 1))` and normalized — plain bilinear when enlarging, an area-like filter when shrinking.
#[derive(Debug, Default)]
pub(crate) struct Axis {
    /// The `(input, out)` sizes the weights are for.
    sizes: (usize, usize),
    /// Taps per output (the widest window).
    width: usize,
    /// First input sample and number of samples of each output.
    first: Vec<(usize, usize)>,
    /// `width` weights per output (zero past its window).
    weights: Vec<f32>,
}

impl Axis {
    /// Computes the weights for `input` samples to `out` (buffers reused), unless they are
    /// already those: every row of a `resize`, or random windows of the same size.
    fn compute(&mut self, input: usize, out: usize) {
        if self.sizes == (input, out) {
            return;
        }
        self.sizes = (input, out);
        let scale = input as f32 / out as f32;
        let (support, invscale) = if scale >= 1.0 {
            (scale, 1.0 / scale)
        } else {
            (1.0, 1.0)
        };
        self.width = (support.ceil() as usize) * 2 + 1;
        self.first.clear();
        self.weights.clear();
        self.weights.resize(out * self.width, 0.0);
        for i in 0..out {
            let center = scale * (i as f32 + 0.5);
            // Truncation toward zero, as PyTorch's `static_cast<int64_t>`.
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).clamp(0, input as i64) as usize;
            let w = &mut self.weights[i * self.width..(i + 1) * self.width];
            let mut total = 0.0f32;
            for (j, wt) in w.iter_mut().enumerate().take(hi.saturating_sub(lo)) {
                let d = ((j + lo) as f32 - center + 0.5) * invscale;
                *wt = (1.0 - d.abs()).max(0.0);
                total += *wt;
            }
            if total != 0.0 {
                w.iter_mut().for_each(|wt| *wt /= total);
            }
            self.first.push((lo, hi.saturating_sub(lo)));
        }
    }

    /// The first input sample and the weights of output `i` (its window, within the input).
    fn taps(&self, i: usize) -> (usize, &[f32]) {
        let (first, n) = self.first[i];
        (first, &self.weights[i * self.width..i * self.width + n])
    }
}

/// Reused buffers of the resizing path: both axes' weights and the rows resized across.
#[derive(Debug, Default)]
pub(crate) struct Resampler {
    x: Axis,
    y: Axis,
    rows: Vec<f32>,
}

impl Geometry {
    /// The source index that window coordinate `c` (relative to the image's first pixel)
    /// reads on `axis` (0: rows, 1: columns) of an image `n` long; `None`: the constant fill.
    /// With `pad_if_needed`'s padding the image was padded twice, so the padded image's
    /// padding is read through the mode first (`reflect` twice is not `reflect` once).
    fn source(&self, c: i64, n: usize, axis: usize) -> Option<usize> {
        let (p, q) = (self.inner[axis], self.outer[axis]);
        if q == 0 || matches!(self.pad, PaddingMode::Constant | PaddingMode::Edge) {
            return self.pad.index(c, n);
        }
        let j = self.pad.index(c + p as i64, n + 2 * p)?;
        self.pad.index(j as i64 - p as i64, n)
    }

    /// Whether the window lies within the `h`×`w` image (reads no padding).
    fn inside(&self, h: usize, w: usize) -> bool {
        self.top >= 0.0
            && self.left >= 0.0
            && self.top + self.height <= h as f64
            && self.left + self.width <= w as f64
    }
}

const NO_COLOUR: Colour = Colour {
    brightness: 1.0,
    contrast: 1.0,
    saturation: 1.0,
    hue: 0.0,
    order: [
        Adjust::Brightness,
        Adjust::Contrast,
        Adjust::Saturation,
        Adjust::Hue,
    ],
    grey: false,
};

/// One of `color_jitter`'s adjustments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Adjust {
    Brightness,
    Contrast,
    Saturation,
    Hue,
}

/// One torchvision-style attempt at a box (random resized crop, random erasing): an area of
/// `area · U(scale)` pixels and an aspect ratio `exp(U(ln ratio))` (the first bound when the
/// range is a single value), as `(round(√(area · aspect)), round(√(area / aspect)))`.
fn box_attempt(
    rng: &mut ChaCha8Rng,
    area: f64,
    scale: &[f64; 2],
    ratio: &[f64; 2],
) -> (usize, usize) {
    let target = area * rng.random_range(scale[0]..=scale[1]);
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    let aspect = if lr0 < lr1 {
        rng.random_range(lr0..=lr1).exp()
    } else {
        ratio[0]
    };
    (
        (target * aspect).sqrt().round() as usize,
        (target / aspect).sqrt().round() as usize,
    )
}

/// Shifts the hue of one RGB pixel (0–255) by `shift` of the colour wheel, through HSV as
/// torchvision's `adjust_hue` (`_rgb2hsv`, `(h + shift) mod 1`, `_hsv2rgb`).
fn shift_hue(px: &mut [f32], shift: f32) {
    let [r, g, b] = [px[0] / 255.0, px[1] / 255.0, px[2] / 255.0];
    let (max, min) = (r.max(g).max(b), r.min(g).min(b));
    let range = max - min;
    if range == 0.0 {
        return; // grey: no hue
    }
    let s = range / max;
    let (rc, gc, bc) = ((max - r) / range, (max - g) / range, (max - b) / range);
    let h = if max == r {
        bc - gc
    } else if max == g {
        2.0 + rc - bc
    } else {
        4.0 + gc - rc
    };
    let h = ((h / 6.0 + 1.0) % 1.0 + shift).rem_euclid(1.0);
    let v = max;
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let p = (v * (1.0 - s)).clamp(0.0, 1.0);
    let q = (v * (1.0 - s * f)).clamp(0.0, 1.0);
    let t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0);
    let (r, g, b) = match i as i32 % 6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    px[0] = r * 255.0;
    px[1] = g * 255.0;
    px[2] = b * 255.0;
}

/// Where a centre crop of `size` starts in `n` pixels, as torchvision's `CenterCrop`: a crop
/// larger than the image is padded by `(size - n) / 2` (rounded down) before it, a smaller one
/// starts at `(n - size) / 2` rounded half to even (Python's `round`).
fn centre_offset(n: usize, size: usize) -> f64 {
    if size > n {
        -(((size - n) / 2) as f64)
    } else {
        ((n - size) as f64 / 2.0).round_ties_even()
    }
}

/// A `random_erasing` box of the output: rows `top..top + height`, columns
/// `left..left + width` of every channel are set to `value` (its channel's, or noise).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Erase<'a> {
    pub top: usize,
    pub left: usize,
    pub height: usize,
    pub width: usize,
    pub value: &'a EraseValue,
}

impl Erase<'_> {
    /// Erases the box in one CHW output image (`[oh, ow]` per channel). With
    /// `value: random`, the noise is drawn from `rng` (the row's stream, after the box),
    /// channel by channel, row by row.
    fn apply(&self, dst: &mut [f32], [oh, ow]: [usize; 2], rng: &mut ChaCha8Rng) {
        for (k, plane) in dst.chunks_exact_mut(oh * ow).enumerate() {
            for y in self.top..self.top + self.height {
                let row = &mut plane[y * ow + self.left..y * ow + self.left + self.width];
                match self.value {
                    EraseValue::Values(v) => row.fill(v[k.min(v.len() - 1)]),
                    EraseValue::Random => row
                        .iter_mut()
                        .for_each(|x| *x = rng.sample(rand_distr::StandardNormal)),
                }
            }
        }
    }
}

/// Colour factors (1.0 = unchanged).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Colour {
    pub brightness: f32,
    pub contrast: f32,
    pub saturation: f32,
    /// Hue shift, a fraction of the colour wheel (0.0 = unchanged).
    pub hue: f32,
    /// The order the four adjustments are applied in.
    pub order: [Adjust; 4],
    /// Turned to grey (after the adjustments).
    pub grey: bool,
}

impl ImageStage {
    /// Draws the `random_erasing` box of one row (`[oh, ow]` output) from its stream, after
    /// [`Self::draw`]: like torchvision, one number against `p`, then up to 10 (area,
    /// log-ratio) attempts for a box smaller than the image, then its top and left; `None`
    /// when the row is not erased (or no attempt fits).
    pub(crate) fn draw_erase(
        &self,
        rng: &mut ChaCha8Rng,
        [oh, ow]: [usize; 2],
    ) -> Option<Erase<'_>> {
        let Some(ImageOp::RandomErasing {
            p,
            scale,
            ratio,
            value,
        }) = self.ops.last()
        else {
            return None;
        };
        if rng.random::<f64>() >= *p {
            return None;
        }
        for _ in 0..10 {
            // torchvision's erasing ratio is height / width.
            let (h, w) = box_attempt(rng, (oh * ow) as f64, scale, ratio);
            if h < oh && w < ow {
                let top = rng.random_range(0..=oh - h);
                let left = rng.random_range(0..=ow - w);
                return Some(Erase {
                    top,
                    left,
                    height: h,
                    width: w,
                    value,
                });
            }
        }
        None
    }

    /// Draws the geometry and colour of one row from its stream.
    pub(crate) fn draw(&self, rng: &mut ChaCha8Rng, h: usize, w: usize) -> (Geometry, Colour) {
        let mut g = Geometry {
            top: 0.0,
            left: 0.0,
            height: h as f64,
            width: w as f64,
            flip_h: false,
            flip_v: false,
            exact: true,
            pad: PaddingMode::Constant,
            inner: [0, 0],
            outer: [0, 0],
        };
        let mut col = NO_COLOUR;
        let factor = |rng: &mut ChaCha8Rng, x: f64| -> f32 {
            if x > 0.0 {
                rng.random_range(1.0 - x..=1.0 + x) as f32
            } else {
                1.0
            }
        };
        for op in &self.ops {
            match op {
                ImageOp::RandomCrop {
                    size,
                    padding,
                    padding_mode,
                    pad_if_needed,
                    ..
                } => {
                    let p = *padding;
                    // torchvision pads each axis short of `size` by the shortfall on both
                    // sides, then draws the window from the whole padded image.
                    let q = |n: usize, s: usize| {
                        if *pad_if_needed {
                            s.saturating_sub(n + 2 * p)
                        } else {
                            0
                        }
                    };
                    let (qy, qx) = (q(h, size[0]), q(w, size[1]));
                    let max_top = (h + 2 * (p + qy)) as i64 - size[0] as i64;
                    let max_left = (w + 2 * (p + qx)) as i64 - size[1] as i64;
                    let top = rng.random_range(0..=max_top.max(0)) - (p + qy) as i64;
                    let left = rng.random_range(0..=max_left.max(0)) - (p + qx) as i64;
                    g.top = top as f64;
                    g.left = left as f64;
                    g.height = size[0] as f64;
                    g.width = size[1] as f64;
                    g.pad = *padding_mode;
                    g.inner = [p, p];
                    g.outer = [qy, qx];
                }
                ImageOp::RandomResizedCrop { size, scale, ratio } => {
                    let mut found = None;
                    for _ in 0..10 {
                        // The crop's ratio is width / height.
                        let (cw, chh) = box_attempt(rng, (h * w) as f64, scale, ratio);
                        if cw > 0 && cw <= w && chh > 0 && chh <= h {
                            let top = rng.random_range(0..=h - chh);
                            let left = rng.random_range(0..=w - cw);
                            found = Some((top, left, chh, cw));
                            break;
                        }
                    }
                    let (top, left, chh, cw) = found.unwrap_or_else(|| {
                        // Whole image, centre-cropped into the ratio range.
                        let r = w as f64 / h as f64;
                        let (cw, chh) = if r < ratio[0] {
                            (w, ((w as f64 / ratio[0]).round() as usize).clamp(1, h))
                        } else if r > ratio[1] {
                            (((h as f64 * ratio[1]).round() as usize).clamp(1, w), h)
                        } else {
                            (w, h)
                        };
                        ((h - chh) / 2, (w - cw) / 2, chh, cw)
                    });
                    g.top = top as f64;
                    g.left = left as f64;
                    g.height = chh as f64;
                    g.width = cw as f64;
                    g.exact = chh == size[0] && cw == size[1];
                }
                ImageOp::CenterCrop { size } => {
                    g.top = centre_offset(h, size[0]);
                    g.left = centre_offset(w, size[1]);
                    g.height = size[0] as f64;
                    g.width = size[1] as f64;
                }
                ImageOp::Resize { size } => g.exact = *size == [h, w],
                ImageOp::HorizontalFlip { p } => g.flip_h = rng.random::<f64>() < *p,
                ImageOp::VerticalFlip { p } => g.flip_v = rng.random::<f64>() < *p,
                ImageOp::ColorJitter {
                    brightness,
                    contrast,
                    saturation,
                    hue,
                } => {
                    // torchvision draws a permutation of the four first (`randperm(4)`); with
                    // fewer than two enabled the order changes nothing, so none is drawn.
                    let on = [*brightness, *contrast, *saturation, *hue];
                    if on.iter().filter(|&&x| x > 0.0).count() > 1 {
                        for i in (1..4).rev() {
                            col.order.swap(i, rng.random_range(0..=i));
                        }
                    }
                    col.brightness = factor(rng, *brightness);
                    col.contrast = factor(rng, *contrast);
                    col.saturation = factor(rng, *saturation);
                    if *hue > 0.0 {
                        col.hue = rng.random_range(-hue..=*hue) as f32;
                    }
                }
                ImageOp::RandomGrayscale { p } => col.grey = rng.random::<f64>() < *p,
                // Drawn by `draw_erase`, after everything else (it is the last op).
                ImageOp::Normalize { .. } | ImageOp::RandomErasing { .. } => {}
            }
        }
        (g, col)
    }

    /// The common case in one pass: an integer window (crop with padding, flips), no colour
    /// ops — HWC `u8` straight to normalized CHW `f32` in `dst` (one image), padding written
    /// as the normalized 0. Each source row is read once, contiguously.
    fn crop_normalize(&self, src: &[u8], h: usize, w: usize, g: &Geometry, dst: &mut [f32]) {
        let ch = self.shape[2];
        let win = pixels::Window {
            top: g.top as i64,
            left: g.left as i64,
            flip_h: g.flip_h,
            flip_v: g.flip_v,
        };
        if ch == 3 {
            let scale = [self.scale[0], self.scale[1], self.scale[2]];
            let bias = [self.bias[0], self.bias[1], self.bias[2]];
            let pad = [self.pad_value[0], self.pad_value[1], self.pad_value[2]];
            pixels::rgb_crop(src, h, w, self.out_hw, &win, scale, bias, pad, dst);
            return;
        }
        let [oh, ow] = self.out_hw;
        let plane = oh * ow;
        let pixels::Columns { lo, hi, first } = win.columns(w, ow);
        for y in 0..oh {
            let o = y * ow;
            let Some(sy) = win.source_row(y, h, oh).filter(|_| lo < hi) else {
                for k in 0..ch {
                    dst[k * plane + o..k * plane + o + ow].fill(self.pad_value[k]);
                }
                continue;
            };
            for k in 0..ch {
                let row = &mut dst[k * plane + o..k * plane + o + ow];
                row[..lo].fill(self.pad_value[k]);
                row[hi..].fill(self.pad_value[k]);
            }
            let px = &src[(sy * w + first) * ch..(sy * w + first + (hi - lo)) * ch];
            for k in 0..ch {
                let (s, b) = (self.scale[k], self.bias[k]);
                let row = &mut dst[k * plane + o + lo..k * plane + o + hi];
                let pixels = px.iter().skip(k).step_by(ch);
                if g.flip_h {
                    row.iter_mut()
                        .rev()
                        .zip(pixels)
                        .for_each(|(o, p)| *o = *p as f32 * s + b);
                } else {
                    row.iter_mut()
                        .zip(pixels)
                        .for_each(|(o, p)| *o = *p as f32 * s + b);
                }
            }
        }
    }

    /// Samples `src` (HWC u8, `h`×`w`) through `g` into `scratch` (HWC f32, 0–255 scale,
    /// output size); padding reads as `g.pad` says (constant: 0).
    fn sample(
        &self,
        src: &[u8],
        h: usize,
        w: usize,
        g: &Geometry,
        scratch: &mut [f32],
        aa: &mut Resampler,
    ) {
        let ch = self.shape[2];
        let [oh, ow] = self.out_hw;
        if g.exact {
            let (top, left) = (g.top as i64, g.left as i64);
            for y in 0..oh {
                let yy = if g.flip_v { oh - 1 - y } else { y };
                let row = &mut scratch[y * ow * ch..(y + 1) * ow * ch];
                let Some(sy) = g.source(top + yy as i64, h, 0) else {
                    for px in row.chunks_exact_mut(ch) {
                        px.copy_from_slice(&self.fill);
                    }
                    continue;
                };
                let srow = &src[sy * w * ch..(sy + 1) * w * ch];
                for x in 0..ow {
                    let xx = if g.flip_h { ow - 1 - x } else { x };
                    let out = &mut row[x * ch..(x + 1) * ch];
                    match g.source(left + xx as i64, w, 1) {
                        None => out.copy_from_slice(&self.fill),
                        Some(sx) => {
                            let s = &srow[sx * ch..(sx + 1) * ch];
                            for k in 0..ch {
                                out[k] = s[k] as f32;
                            }
                        }
                    }
                }
            }
            return;
        }
        // Bilinear resize of the window, antialiased when shrinking: torchvision's
        // `resize(..., antialias=True)` of the cropped window (PIL's filter), one axis at a
        // time — rows across into `aa.rows`, then down.
        let (top, left) = (g.top as usize, g.left as usize);
        let (wh, ww) = (g.height as usize, g.width as usize);
        aa.x.compute(ww, ow);
        aa.y.compute(wh, oh);
        aa.rows.clear();
        aa.rows.resize(wh * ow * ch, 0.0);
        for sy in 0..wh {
            let at = ((top + sy) * w + left) * ch;
            let srow = &src[at..at + ww * ch];
            let out = &mut aa.rows[sy * ow * ch..(sy + 1) * ow * ch];
            for x in 0..ow {
                let (first, weights) = aa.x.taps(x);
                for k in 0..ch {
                    out[x * ch + k] = weights
                        .iter()
                        .enumerate()
                        .map(|(j, wt)| f32::from(srow[(first + j) * ch + k]) * wt)
                        .sum();
                }
            }
        }
        for y in 0..oh {
            let yy = if g.flip_v { oh - 1 - y } else { y };
            let (first, weights) = aa.y.taps(yy);
            for x in 0..ow {
                let xx = if g.flip_h { ow - 1 - x } else { x };
                for k in 0..ch {
                    scratch[(y * ow + x) * ch + k] = weights
                        .iter()
                        .enumerate()
                        .map(|(j, wt)| aa.rows[((first + j) * ow + xx) * ch + k] * wt)
                        .sum();
                }
            }
        }
    }

    /// Brightness, contrast, saturation and hue on the 0–255 scratch buffer, in the drawn
    /// order, clamping like torchvision (contrast blends with the mean grey level of the image
    /// as it is at that step, saturation with each pixel's grey), then grey.
    fn colour(&self, scratch: &mut [f32], c: &Colour) {
        let ch = self.shape[2];
        let clamp = |v: f32| v.clamp(0.0, 255.0);
        // torchvision's `rgb_to_grayscale` on tensors (v1 and v2): 0.2989 for red (PIL's
        // integer formula has 0.299).
        let grey = |px: &[f32]| -> f32 {
            if ch == 3 {
                0.2989 * px[0] + 0.587 * px[1] + 0.114 * px[2]
            } else {
                px[0]
            }
        };
        for step in c.order {
            match step {
                Adjust::Brightness if c.brightness != 1.0 => {
                    for v in scratch.iter_mut() {
                        *v = clamp(*v * c.brightness);
                    }
                }
                Adjust::Contrast if c.contrast != 1.0 => {
                    let n = scratch.len() / ch;
                    let mean = scratch.chunks_exact(ch).map(grey).sum::<f32>() / n as f32;
                    for v in scratch.iter_mut() {
                        *v = clamp((*v - mean) * c.contrast + mean);
                    }
                }
                Adjust::Saturation if c.saturation != 1.0 => {
                    for px in scratch.chunks_exact_mut(ch) {
                        let g = grey(px);
                        for v in px.iter_mut() {
                            *v = clamp((*v - g) * c.saturation + g);
                        }
                    }
                }
                Adjust::Hue if c.hue != 0.0 && ch == 3 => {
                    for px in scratch.chunks_exact_mut(3) {
                        shift_hue(px, c.hue);
                    }
                }
                _ => {}
            }
        }
        if c.grey && ch == 3 {
            for px in scratch.chunks_exact_mut(3) {
                px.fill(grey(px));
            }
        }
    }

    /// Decodes one row into HWC u8 pixels: borrowed for raw, owned for PNG/JPEG.
    fn decode<'a>(
        &self,
        bytes: &'a [u8],
        owned: &'a mut Vec<u8>,
    ) -> std::result::Result<(&'a [u8], usize, usize), String> {
        let [h, w, ch] = self.shape;
        let format = match self.format {
            ImageFormat::Raw => {
                if bytes.len() != h * w * ch {
                    return Err(format!(
                        "{} bytes, but shape [{h}, {w}, {ch}] needs {}",
                        bytes.len(),
                        h * w * ch
                    ));
                }
                return Ok((bytes, h, w));
            }
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::Auto => {
                image::guess_format(bytes).map_err(|e| format!("not a PNG or JPEG image ({e})"))?
            }
        };
        let img = image::load_from_memory_with_format(bytes, format)
            .map_err(|e| format!("cannot decode the {format:?} image: {e}"))?;
        let (iw, ih) = (img.width() as usize, img.height() as usize);
        let has_crop = self.ops.iter().any(|o| {
            matches!(
                o,
                ImageOp::RandomCrop { .. }
                    | ImageOp::RandomResizedCrop { .. }
                    | ImageOp::CenterCrop { .. }
                    | ImageOp::Resize { .. }
            )
        });
        let cropped_fits = self.ops.iter().all(|o| match o {
            ImageOp::RandomCrop {
                size,
                padding,
                pad_if_needed,
                ..
            } => *pad_if_needed || (size[0] <= ih + 2 * padding && size[1] <= iw + 2 * padding),
            _ => true,
        });
        if !has_crop && (ih, iw) != (h, w) {
            return Err(format!(
                "the image is {iw}×{ih} (width×height), the stage expects {w}×{h}"
            ));
        }
        if !cropped_fits {
            return Err(format!(
                "the image is {iw}×{ih} (width×height), smaller than random_crop's size with its padding (set `pad_if_needed: true` to pad such images up to it)"
            ));
        }
        *owned = if ch == 3 {
            img.into_rgb8().into_raw()
        } else {
            img.into_luma8().into_raw()
        };
        Ok((owned.as_slice(), ih, iw))
    }
}

impl ImageStage {
    /// Writes the bad rows `bad` (row, error) of `batch` to the dead-letter directory: one
    /// JSON line each, with the row's origin, the error and the bytes (base64).
    fn dead_letters(
        &self,
        dl: &ImageDeadLetter,
        batch: &Batch,
        bad: &[(usize, String)],
    ) -> Result<()> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let col = batch.data.column(self.input);
        let lines: Vec<serde_json::Value> = bad
            .iter()
            .map(|(r, error)| {
                let mut line = batch
                    .lineage
                    .slice(*r as u64, 1)
                    .spans()
                    .first()
                    .map(origin_fields)
                    .unwrap_or_default();
                line.insert("stage".into(), self.stage.to_string().into());
                line.insert(
                    "column".into(),
                    self.schema.field(self.output).name().as_str().into(),
                );
                line.insert("error".into(), error.as_str().into());
                line.insert(
                    "value_base64".into(),
                    raw_bytes(col, *r).map(|b| b64.encode(b)).into(),
                );
                serde_json::Value::Object(line)
            })
            .collect();
        let mut files = dl
            .files
            .lock()
            .map_err(|_| Error::Internal(format!("{}: dead-letter lock poisoned", self.stage)))?;
        dl.runtime.block_on(files.write(&lines))
    }
}

/// Where a row came from, as a dead letter's fields: `url`, `row_group`, `row`, `epoch` (a
/// file), or `topic`, `partition`, `offset` (and `row_in_message`) from Kafka.
fn origin_fields(s: &crate::batch::LineageSpan) -> serde_json::Map<String, serde_json::Value> {
    use crate::batch::Origin;
    let v = match &s.origin {
        Origin::Object { url, row_group } => serde_json::json!({
            "url": &**url, "row_group": row_group, "row": s.first, "epoch": s.epoch,
        }),
        Origin::Kafka { topic, partition } => serde_json::json!({
            "topic": &**topic, "partition": partition, "offset": s.first,
        }),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            ..
        } => serde_json::json!({
            "topic": &**topic, "partition": partition, "offset": offset,
            "row_in_message": s.first,
        }),
    };
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// The bytes of row `r` of an image column (`None`: null).
fn raw_bytes(col: &ArrayRef, r: usize) -> Option<&[u8]> {
    if col.is_null(r) {
        return None;
    }
    Some(match col.data_type() {
        DataType::Binary => col.as_binary::<i32>().value(r),
        DataType::LargeBinary => col.as_binary::<i64>().value(r),
        DataType::BinaryView => col.as_binary_view().value(r),
        DataType::FixedSizeList(_, n) => {
            let list = col.as_fixed_size_list();
            let n = *n as usize;
            let values = list.values().as_primitive::<UInt8Type>().values();
            let at = (list.offset() + r) * n;
            &values[at..at + n]
        }
        _ => col.as_fixed_size_binary().value(r),
    })
}

impl Transform for ImageStage {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let col = batch.data.column(self.input);
        let n = batch.num_rows();
        let ch = self.shape[2];
        let [oh, ow] = self.out_hw;
        let width = ch * oh * ow;
        let ids = row_ids(&batch.lineage);
        // Every element is overwritten below (bad rows with zeros).
        let mut out = self.buffers.take(n * width);
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
        for ((r, id), dst) in ids.iter().enumerate().zip(out.chunks_exact_mut(width)) {
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
                    continue;
                }
            };
            rng.set_stream(*id);
            let (g, c) = self.draw(&mut rng, h, w);
            let erase = self.draw_erase(&mut rng, [oh, ow]);
            if g.exact && c == NO_COLOUR && (g.pad == PaddingMode::Constant || g.inside(h, w)) {
                self.crop_normalize(src, h, w, &g, dst);
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
        }
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
        let field = Arc::new(Field::new_list_field(DataType::Float32, false));
        let values = Float32Array::new(self.buffers.into_buffer(out), None);
        let list = FixedSizeListArray::try_new(field, width as i32, Arc::new(values), None)
            .map_err(|e| Error::Arrow {
                context: self.stage.to_string(),
                source: e,
            })?;
        let mut columns: Vec<ArrayRef> = batch.data.columns().to_vec();
        if self.replace {
            columns[self.output] = Arc::new(list);
        } else {
            columns.push(Arc::new(list));
        }
        let data =
            RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| Error::Arrow {
                context: self.stage.to_string(),
                source: e,
            })?;
        if bad.is_empty() {
            return Ok(batch.with_data(data));
        }
        // on_error: skip — every dropped row is named in the log and counted (rows removed),
        // and with a dead letter stored, with its bytes, before the batch goes on.
        if let Some(dl) = &self.dead_letter {
            self.dead_letters(dl, &batch, &bad)?;
        }
        let mut keep = vec![true; n];
        for (r, e) in &bad {
            keep[*r] = false;
            tracing::warn!(
                "{}: skipped a bad image ({e}) at {}",
                self.stage,
                batch.lineage.describe_row(*r as u64)
            );
        }
        let mask = BooleanArray::from(keep);
        let lineage = batch.lineage.filter(&mask);
        let kept = filter_record_batch(&data, &mask).map_err(|e| Error::Arrow {
            context: self.stage.to_string(),
            source: e,
        })?;
        Ok(Batch::new(kept, lineage).with_position_of(&batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Lineage, Name, Origin};
    use arrow::array::{BinaryArray, FixedSizeBinaryArray};
    use arrow::datatypes::{Float32Type, Schema};

    fn stage_ref() -> StageRef {
        StageRef {
            index: 0,
            kind: "image",
            location: None,
        }
    }

    /// A batch of `rows` raw images; `pixel(row, y, x, c)` gives the bytes.
    fn batch(
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

    fn build_stage(
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
    fn try_build(c: ImageConfig, input: &Batch) -> Result<(ImageStage, SchemaRef)> {
        build(
            &stage_ref(),
            &c,
            &input.data.schema(),
            &crate::stage::BuildContext::default(),
        )
    }

    fn config(
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
            on_error,
            dead_letter: None,
        }
    }

    /// Why a raw-image stage with these ops is refused.
    fn refusal(shape: [usize; 3], input: &Batch, ops: Vec<ImageOp>) -> String {
        try_build(config(shape, ops, OnError::Fail, ImageFormat::Raw), input)
            .unwrap_err()
            .to_string()
    }

    /// Output row `r` as a CHW vector.
    fn row(b: &Batch, r: usize) -> Vec<f32> {
        let l = b.data.column(0).as_fixed_size_list();
        l.value(r).as_primitive::<Float32Type>().values().to_vec()
    }

    /// Identity scaling: normalize with mean 0, std 1/255 outputs the raw 0–255 values.
    fn identity(ch: usize) -> ImageOp {
        ImageOp::Normalize {
            mean: vec![0.0; ch],
            std: vec![1.0 / 255.0; ch],
        }
    }

    #[test]
    fn output_is_chw_and_normalized() {
        let input = batch([2, 2, 3], 1, |_, y, x, c| (c * 100 + y * 2 + x) as u8);
        let st = build_stage(
            [2, 2, 3],
            &input,
            vec![ImageOp::Normalize {
                mean: vec![0.5, 0.5, 0.5],
                std: vec![0.25, 0.5, 1.0],
            }],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = st.apply(input).unwrap();
        let v = row(&out, 0);
        // Channel planes in order, each row-major; (p/255 - 0.5) / std.
        let expect: Vec<f32> = (0..3)
            .flat_map(|c| (0..4).map(move |i| (c, i)))
            .map(|(c, i)| {
                let p = (c * 100 + i) as f32;
                (p / 255.0 - 0.5) / [0.25, 0.5, 1.0][c]
            })
            .collect();
        for (a, b) in v.iter().zip(&expect) {
            assert!((a - b).abs() < 1e-5, "{v:?} vs {expect:?}");
        }
        assert_eq!(
            out.data.schema().field(0).data_type(),
            &DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Float32, false)),
                12
            )
        );
    }

    #[test]
    fn random_crop_with_padding_shifts_by_the_drawn_offsets() {
        let shape = [4, 5, 1];
        let input = batch(shape, 64, |r, y, x, _| (r + y * 10 + x + 1) as u8);
        let st = build_stage(
            shape,
            &input,
            vec![
                ImageOp::RandomCrop {
                    size: [4, 5],
                    padding: 2,
                    padding_mode: PaddingMode::Constant,
                    pad_if_needed: false,
                    fill: PadFill::default(),
                },
                identity(1),
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let ids = row_ids(&input.lineage);
        let out = st.apply(input).unwrap();
        let mut offsets = std::collections::BTreeSet::new();
        for (r, id) in ids.iter().enumerate() {
            let mut rng = ChaCha8Rng::from_seed(st.key);
            rng.set_stream(*id);
            let (g, _) = st.draw(&mut rng, 4, 5);
            let (dy, dx) = (g.top as i64, g.left as i64);
            assert!((-2..=2).contains(&dy) && (-2..=2).contains(&dx));
            offsets.insert((dy, dx));
            let v = row(&out, r);
            for y in 0..4i64 {
                for x in 0..5i64 {
                    let (sy, sx) = (y + dy, x + dx);
                    let want = if (0..4).contains(&sy) && (0..5).contains(&sx) {
                        (r as i64 + sy * 10 + sx + 1) as f32
                    } else {
                        0.0 // zero padding
                    };
                    assert_eq!(
                        v[(y * 5 + x) as usize],
                        want,
                        "row {r} offset ({dy},{dx}) at ({y},{x})"
                    );
                }
            }
        }
        // 64 rows draw many different offsets (25 possible).
        assert!(offsets.len() >= 12, "{offsets:?}");
    }

    #[test]
    fn one_pass_crop_equals_the_general_path() {
        // Small, and wider than the one-pass conversion's chunk (rows of 140 output pixels
        // are converted in 3 chunks, straight and mirrored).
        one_pass_matches([5, 7, 3], [4, 6], 3, 1, &[0.0]);
        one_pass_matches([3, 150, 3], [2, 140], 3, 5, &[0.0]);
        one_pass_matches([3, 150, 1], [2, 140], 3, 5, &[0.0]);
        // CIFAR: every offset of a crop with padding 4 (rows of 28–32 pixels in the image).
        one_pass_matches([32, 32, 3], [32, 32], 4, 1, &[0.0]);
        // A `fill` other than 0: one per channel, or one for all.
        one_pass_matches([5, 7, 3], [4, 6], 3, 1, &[124.0, 116.0, 104.0]);
        one_pass_matches([3, 150, 1], [2, 140], 3, 5, &[255.0]);
    }

    fn one_pass_matches(
        shape: [usize; 3],
        size: [usize; 2],
        padding: usize,
        step: usize,
        fill: &[f32],
    ) {
        let [h, w, ch] = shape;
        let input = batch(shape, 1, |_, y, x, c| (y * 31 + x * 7 + c * 3) as u8);
        let st = build_stage(
            shape,
            &input,
            vec![
                ImageOp::RandomCrop {
                    size,
                    padding,
                    padding_mode: PaddingMode::Constant,
                    pad_if_needed: false,
                    fill: PadFill(fill.to_vec()),
                },
                ImageOp::Normalize {
                    mean: vec![0.1, 0.2, 0.3][..ch].to_vec(),
                    std: vec![0.3, 0.2, 0.1][..ch].to_vec(),
                },
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let src: Vec<u8> = (0..h * w * ch).map(|i| (i * 5 % 256) as u8).collect();
        let n = size[0] * size[1];
        let p = padding as i64;
        for top in (-p..=(h as i64 + p - size[0] as i64)).step_by(step) {
            for left in (-p..=(w as i64 + p - size[1] as i64)).step_by(step) {
                for (fh, fv) in [(false, false), (true, false), (false, true), (true, true)] {
                    let g = Geometry {
                        top: top as f64,
                        left: left as f64,
                        height: size[0] as f64,
                        width: size[1] as f64,
                        flip_h: fh,
                        flip_v: fv,
                        exact: true,
                        pad: PaddingMode::Constant,
                        inner: [0, 0],
                        outer: [0, 0],
                    };
                    let mut fast = vec![0f32; n * ch];
                    st.crop_normalize(&src, h, w, &g, &mut fast);
                    let mut scratch = vec![0f32; n * ch];
                    st.sample(&src, h, w, &g, &mut scratch, &mut Resampler::default());
                    let slow: Vec<f32> = (0..ch)
                        .flat_map(|k| (0..n).map(move |i| (k, i)))
                        .map(|(k, i)| scratch[i * ch + k] * st.scale[k] + st.bias[k])
                        .collect();
                    assert_eq!(
                        fast, slow,
                        "{shape:?} top {top} left {left} flips {fh} {fv}"
                    );
                    // A corner that sticks out holds the fill, normalized.
                    if top < 0 && left < 0 && !fh && !fv {
                        for k in 0..ch {
                            let want = fill[k % fill.len()] * st.scale[k] + st.bias[k];
                            assert_eq!(fast[k * n], want, "channel {k}");
                        }
                    }
                }
            }
        }
    }

    /// The four padding modes by hand, on a 3×3 image (1..9) read through windows that stick
    /// out 2 pixels at the top-left and 1–2 at the bottom-right.
    #[test]
    fn padding_modes_read_like_torchvision() {
        let shape = [3, 3, 1];
        let input = batch(shape, 1, |_, _, _, _| 0);
        let src: Vec<u8> = (1..=9).collect();
        let read = |mode: PaddingMode, top: f64, left: f64| -> Vec<f32> {
            let st = build_stage(
                shape,
                &input,
                vec![ImageOp::RandomCrop {
                    size: [3, 3],
                    padding: 2,
                    padding_mode: mode,
                    pad_if_needed: false,
                    fill: PadFill::default(),
                }],
                OnError::Fail,
                ImageFormat::Raw,
            );
            let g = Geometry {
                top,
                left,
                height: 3.0,
                width: 3.0,
                flip_h: false,
                flip_v: false,
                exact: true,
                pad: mode,
                inner: [0, 0],
                outer: [0, 0],
            };
            let mut out = vec![f32::NAN; 9];
            st.sample(&src, 3, 3, &g, &mut out, &mut Resampler::default());
            out
        };
        use PaddingMode::*;
        // Rows and columns -2, -1, 0.
        let corner = |m| read(m, -2.0, -2.0);
        assert_eq!(corner(Constant), [0., 0., 0., 0., 0., 0., 0., 0., 1.]);
        assert_eq!(corner(Edge), [1.; 9]);
        assert_eq!(corner(Reflect), [9., 8., 7., 6., 5., 4., 3., 2., 1.]);
        assert_eq!(corner(Symmetric), [5., 4., 4., 2., 1., 1., 2., 1., 1.]);
        // Rows 1, 2, 3 and columns 2, 3, 4.
        let far = |m| read(m, 1.0, 2.0);
        assert_eq!(far(Constant), [6., 0., 0., 9., 0., 0., 0., 0., 0.]);
        assert_eq!(far(Edge), [6., 6., 6., 9., 9., 9., 9., 9., 9.]);
        assert_eq!(far(Reflect), [6., 5., 4., 9., 8., 7., 6., 5., 4.]);
        assert_eq!(far(Symmetric), [6., 6., 5., 9., 9., 8., 9., 9., 8.]);
        // Beyond one width the pattern repeats, as numpy's `pad` (checked against
        // `np.pad(np.arange(3), 7, mode)`).
        let line = |m: PaddingMode| (-7..=7).map(|i| m.index(i, 3).unwrap()).collect::<Vec<_>>();
        assert_eq!(line(Reflect), [1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1]);
        assert_eq!(
            line(Symmetric),
            [0, 0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0, 1]
        );
        assert_eq!(line(Edge), [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2]);
        assert_eq!(Reflect.index(-3, 1), Some(0));
    }

    /// Through the whole stage: a mode changes only the rows whose window sticks out, and
    /// there it reads image pixels, never the zeros of constant padding.
    #[test]
    fn padding_mode_changes_only_windows_that_stick_out() {
        let shape = [4, 5, 3];
        let input = || {
            batch(shape, 200, |r, y, x, c| {
                (1 + (r * 7 + y * 20 + x * 3 + c) % 250) as u8
            })
        };
        let run = |mode| {
            let ops = vec![
                ImageOp::RandomCrop {
                    size: [4, 5],
                    padding: 2,
                    padding_mode: mode,
                    pad_if_needed: false,
                    fill: PadFill::default(),
                },
                ImageOp::HorizontalFlip { p: 0.5 },
                identity(3),
            ];
            let st = build_stage(shape, &input(), ops, OnError::Fail, ImageFormat::Raw);
            let out = st.apply(input()).unwrap();
            (0..200).map(|r| row(&out, r)).collect::<Vec<_>>()
        };
        let zero = run(PaddingMode::Constant);
        let (mut inside, mut outside) = (0, 0);
        for mode in [
            PaddingMode::Edge,
            PaddingMode::Reflect,
            PaddingMode::Symmetric,
        ] {
            for (r, (a, b)) in run(mode).iter().zip(&zero).enumerate() {
                assert!(
                    a.iter().all(|&v| v > 0.0),
                    "{mode:?} row {r} reads a zero: {a:?}"
                );
                if b.iter().all(|&v| v > 0.0) {
                    assert_eq!(a, b, "{mode:?} row {r}: window inside the image");
                    inside += 1;
                } else {
                    outside += 1;
                }
            }
        }
        // 1 of 5 tops and 1 of 5 lefts is inside: ~4 % of rows.
        assert!(
            inside > 0 && outside > inside,
            "{inside} inside, {outside} outside"
        );
    }

    #[test]
    fn flips_mirror_exactly() {
        let shape = [2, 3, 1];
        let input = batch(shape, 1, |_, y, x, _| (y * 3 + x) as u8);
        let h = build_stage(
            shape,
            &input,
            vec![ImageOp::HorizontalFlip { p: 1.0 }, identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        assert_eq!(
            row(&h.apply(input.clone()).unwrap(), 0),
            vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]
        );
        let v = build_stage(
            shape,
            &input,
            vec![ImageOp::VerticalFlip { p: 1.0 }, identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        assert_eq!(
            row(&v.apply(input.clone()).unwrap(), 0),
            vec![3.0, 4.0, 5.0, 0.0, 1.0, 2.0]
        );
        let none = build_stage(
            shape,
            &input,
            vec![ImageOp::HorizontalFlip { p: 0.0 }, identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        assert_eq!(
            row(&none.apply(input).unwrap(), 0),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
    }

    #[test]
    fn flip_probability_is_respected() {
        let shape = [1, 2, 1];
        let input = batch(shape, 4000, |_, _, x, _| x as u8);
        let st = build_stage(
            shape,
            &input,
            vec![ImageOp::HorizontalFlip { p: 0.5 }, identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = st.apply(input).unwrap();
        let flipped = (0..4000).filter(|r| row(&out, *r)[0] == 1.0).count();
        assert!((1800..2200).contains(&flipped), "{flipped}");
    }

    /// A resized crop reads exactly its window: the same as resizing a copy of the window
    /// cut out of the image (whose resize `tests/torch_parity.rs` checks against libtorch).
    #[test]
    fn resized_crop_resizes_exactly_its_window() {
        let (h, w) = (23usize, 31usize);
        let shape = [h, w, 3];
        let input = batch(shape, 100, |r, y, x, c| {
            ((r * 5 + y * 11 + x * 7 + c * 40) % 256) as u8
        });
        let st = build_stage(
            shape,
            &input,
            vec![
                ImageOp::RandomResizedCrop {
                    size: [9, 12],
                    scale: [0.1, 0.9],
                    ratio: [0.5, 2.0],
                },
                ImageOp::HorizontalFlip { p: 0.5 },
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let col = input.data.column(0).as_fixed_size_binary().clone();
        let ids = row_ids(&input.lineage);
        let (mut inside, mut aa) = (0, Resampler::default());
        for (r, id) in ids.iter().enumerate() {
            let mut rng = ChaCha8Rng::from_seed(st.key);
            rng.set_stream(*id);
            let (g, _) = st.draw(&mut rng, h, w);
            let (top, left) = (g.top as usize, g.left as usize);
            let (wh, ww) = (g.height as usize, g.width as usize);
            inside += usize::from(wh < h && ww < w);
            let cut: Vec<u8> = (top..top + wh)
                .flat_map(|y| col.value(r)[(y * w + left) * 3..(y * w + left + ww) * 3].to_vec())
                .collect();
            let whole = Geometry {
                top: 0.0,
                left: 0.0,
                height: wh as f64,
                width: ww as f64,
                ..g
            };
            let (mut a, mut b) = (vec![0f32; 9 * 12 * 3], vec![0f32; 9 * 12 * 3]);
            st.sample(col.value(r), h, w, &g, &mut a, &mut aa);
            st.sample(&cut, wh, ww, &whole, &mut b, &mut aa);
            assert_eq!(a, b, "row {r}: {g:?}");
        }
        assert!(
            inside > 50,
            "{inside} of 100 windows strictly inside the image"
        );
    }

    #[test]
    fn resized_crop_of_the_whole_image_and_upsampling() {
        let shape = [4, 4, 1];
        let input = batch(shape, 3, |_, y, x, _| (y * 4 + x) as u8);
        let whole = build_stage(
            shape,
            &input,
            vec![
                ImageOp::RandomResizedCrop {
                    size: [4, 4],
                    scale: [1.0, 1.0],
                    ratio: [1.0, 1.0],
                },
                identity(1),
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = whole.apply(input.clone()).unwrap();
        assert_eq!(row(&out, 1), (0..16).map(|v| v as f32).collect::<Vec<_>>());
        // 2× bilinear upsampling of a constant image stays constant; of a ramp stays monotone.
        let up = build_stage(
            shape,
            &input,
            vec![
                ImageOp::RandomResizedCrop {
                    size: [8, 8],
                    scale: [1.0, 1.0],
                    ratio: [1.0, 1.0],
                },
                identity(1),
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let v = row(&up.apply(input).unwrap(), 0);
        assert_eq!(v.len(), 64);
        assert_eq!(v[0], 0.0);
        assert_eq!(v[63], 15.0);
        for y in 0..8 {
            for x in 1..8 {
                assert!(v[y * 8 + x] >= v[y * 8 + x - 1]);
            }
        }
    }

    #[test]
    fn brightness_scales_within_its_range() {
        let shape = [2, 2, 3];
        let input = batch(shape, 200, |_, _, _, _| 100);
        let st = build_stage(
            shape,
            &input,
            vec![
                ImageOp::ColorJitter {
                    brightness: 0.2,
                    contrast: 0.0,
                    saturation: 0.0,
                    hue: 0.0,
                },
                identity(3),
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = st.apply(input).unwrap();
        let mut seen = Vec::new();
        for r in 0..200 {
            let v = row(&out, r);
            assert!(
                v.iter().all(|x| (x - v[0]).abs() < 1e-3),
                "uniform factor per image"
            );
            assert!((80.0..=120.0).contains(&v[0]), "{}", v[0]);
            seen.push(v[0]);
        }
        seen.sort_by(f32::total_cmp);
        assert!(seen[199] - seen[0] > 30.0);
    }

    #[test]
    fn png_and_jpeg_decode() {
        use image::ImageEncoder;
        let (h, w) = (6usize, 5usize);
        let raw: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 % 256) as u8).collect();
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&raw, w as u32, h as u32, image::ExtendedColorType::Rgb8)
            .unwrap();
        let flat = vec![128u8; h * w * 3];
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
            .write_image(&flat, w as u32, h as u32, image::ExtendedColorType::Rgb8)
            .unwrap();
        let arr = BinaryArray::from_iter_values([png.as_slice(), jpeg.as_slice()]);
        let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///x"),
            row_group: 0,
        };
        let input = Batch::new(data, Lineage::new(origin, 0, 2, 0));
        let st = build_stage(
            [h, w, 3],
            &input,
            vec![identity(3)],
            OnError::Fail,
            ImageFormat::Auto,
        );
        let out = st.apply(input).unwrap();
        let v = row(&out, 0);
        for c in 0..3 {
            for i in 0..h * w {
                assert_eq!(v[c * h * w + i], raw[i * 3 + c] as f32);
            }
        }
        assert!(row(&out, 1).iter().all(|x| (x - 128.0).abs() <= 2.0));
    }

    /// numpy's `pad` of an `h`×`w` grid of pixels by `py` rows and `px` columns on each side
    /// (at most one image width, so one reflection), written out per mode: the reference
    /// for `pad_if_needed`, which pads the padded image again.
    fn np_pad(
        img: &[Vec<Vec<f32>>],
        py: usize,
        px: usize,
        mode: PaddingMode,
        fill: &[f32],
    ) -> Vec<Vec<Vec<f32>>> {
        let (h, w) = (img.len() as i64, img[0].len() as i64);
        let at = |i: i64, n: i64| -> Option<usize> {
            let j = match mode {
                _ if (0..n).contains(&i) => i,
                PaddingMode::Constant => return None,
                PaddingMode::Edge => i.clamp(0, n - 1),
                PaddingMode::Reflect if i < 0 => -i,
                PaddingMode::Reflect => 2 * (n - 1) - i,
                PaddingMode::Symmetric if i < 0 => -i - 1,
                PaddingMode::Symmetric => 2 * n - 1 - i,
            };
            Some(j as usize)
        };
        (-(py as i64)..h + py as i64)
            .map(|y| {
                (-(px as i64)..w + px as i64)
                    .map(|x| match (at(y, h), at(x, w)) {
                        (Some(sy), Some(sx)) => img[sy][sx].clone(),
                        _ => fill.to_vec(),
                    })
                    .collect()
            })
            .collect()
    }

    /// PNGs of other sizes than the crop: with `pad_if_needed`, every output is a window of
    /// the image padded by `padding`, then by each axis' shortfall (as torchvision does, in
    /// two steps: reflecting the reflection), for every mode; the window is drawn from the
    /// whole twice-padded image. Without it, a small image is an error that says so.
    #[test]
    fn pad_if_needed_pads_small_images_twice_like_torchvision() {
        use image::ImageEncoder;
        // (height, width): short in both axes, in one, and large enough.
        let sizes = [(3usize, 2usize), (2, 2), (5, 6), (7, 4)];
        let raws: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, (h, w))| {
                (0..h * w * 3)
                    .map(|i| (1 + (i * 37 + k * 11) % 250) as u8)
                    .collect()
            })
            .collect();
        let pngs: Vec<Vec<u8>> = sizes
            .iter()
            .zip(&raws)
            .map(|((h, w), raw)| {
                let mut png = Vec::new();
                image::codecs::png::PngEncoder::new(&mut png)
                    .write_image(raw, *w as u32, *h as u32, image::ExtendedColorType::Rgb8)
                    .unwrap();
                png
            })
            .collect();
        // Every image 40 times: 40 rows each, so 40 draws of its window.
        let rows: Vec<usize> = (0..160).map(|r| r % 4).collect();
        let arr = BinaryArray::from_iter_values(rows.iter().map(|&k| pngs[k].as_slice()));
        let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///small.parquet"),
            row_group: 0,
        };
        let input = Batch::new(data, Lineage::new(origin, 0, rows.len() as u64, 0));
        let (size, padding) = ([6usize, 6usize], 1usize);
        for (mode, fill) in [
            (PaddingMode::Constant, vec![9.0, 99.0, 199.0]),
            (PaddingMode::Edge, vec![0.0]),
            (PaddingMode::Reflect, vec![0.0]),
            (PaddingMode::Symmetric, vec![0.0]),
        ] {
            let crop = |pad_if_needed| ImageOp::RandomCrop {
                size,
                padding,
                padding_mode: mode,
                pad_if_needed,
                fill: PadFill(fill.clone()),
            };
            let ops = vec![crop(true), identity(3)];
            let st = build_stage([6, 6, 3], &input, ops, OnError::Fail, ImageFormat::Png);
            let out = st.apply(input.clone()).unwrap();
            let fill3: Vec<f32> = (0..3).map(|k| fill[k % fill.len()]).collect();
            let mut offsets = vec![std::collections::BTreeSet::new(); 4];
            for (r, &k) in rows.iter().enumerate() {
                let (h, w) = sizes[k];
                let img: Vec<Vec<Vec<f32>>> = (0..h)
                    .map(|y| {
                        (0..w)
                            .map(|x| {
                                (0..3)
                                    .map(|c| raws[k][(y * w + x) * 3 + c] as f32)
                                    .collect()
                            })
                            .collect()
                    })
                    .collect();
                let once = np_pad(&img, padding, padding, mode, &fill3);
                let (qy, qx) = (
                    size[0].saturating_sub(h + 2 * padding),
                    size[1].saturating_sub(w + 2 * padding),
                );
                let twice = np_pad(&once, qy, qx, mode, &fill3);
                let got = row(&out, r);
                let window = |top: usize, left: usize| -> Vec<f32> {
                    (0..3)
                        .flat_map(|c| {
                            let twice = &twice;
                            (0..size[0]).flat_map(move |y| {
                                (0..size[1]).map(move |x| twice[top + y][left + x][c])
                            })
                        })
                        .collect()
                };
                let found = (0..=twice.len() - size[0])
                    .flat_map(|t| (0..=twice[0].len() - size[1]).map(move |l| (t, l)))
                    .find(|&(t, l)| window(t, l) == got);
                let Some(at) = found else {
                    panic!(
                        "{mode:?}: row {r} ({h}×{w}) is no window of the twice-padded image: {got:?}"
                    );
                };
                offsets[k].insert(at);
            }
            // Each image's windows come from all over its padded image.
            for (k, o) in offsets.iter().enumerate() {
                assert!(o.len() >= 4, "{mode:?}: image {k} had windows {o:?}");
            }
            // Without `pad_if_needed`, the image 3×2 does not fit.
            let st = build_stage(
                [6, 6, 3],
                &input,
                vec![crop(false), identity(3)],
                OnError::Fail,
                ImageFormat::Png,
            );
            let e = st.apply(input.clone()).unwrap_err().to_string();
            assert!(
                e.contains("the image is 2×3 (width×height), smaller than random_crop's size"),
                "{e}"
            );
            assert!(e.contains("pad_if_needed: true"), "{e}");
        }
    }

    #[test]
    fn bad_images_fail_with_lineage_or_are_skipped() {
        let arr = BinaryArray::from_opt_vec(vec![
            Some(&[1u8; 12][..]),
            Some(&[1u8; 11][..]),
            Some(b"\x89PNG\r\n\x1a\n garbage".as_slice()),
            None,
            Some(&[2u8; 12][..]),
        ]);
        let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///bad.parquet"),
            row_group: 3,
        };
        let input = Batch::new(data, Lineage::new(origin, 100, 5, 0));
        let fail = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Raw);
        let e = fail.apply(input.clone()).unwrap_err().to_string();
        assert!(e.contains("11 bytes, but shape [2, 2, 3] needs 12"), "{e}");
        assert!(
            e.contains("file:///bad.parquet row group 3, row 101"),
            "{e}"
        );
        assert!(e.contains("and 2 more"), "{e}");
        let auto = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Png);
        let e = auto.apply(input.slice(2, 1)).unwrap_err().to_string();
        assert!(e.contains("cannot decode the Png image"), "{e}");
        assert!(e.contains("row 102"), "{e}");
        let skip = build_stage([2, 2, 3], &input, vec![], OnError::Skip, ImageFormat::Raw);
        let out = skip.apply(input).unwrap();
        assert_eq!(out.num_rows(), 2);
        assert_eq!(out.lineage.spans()[0].first, 100);
        assert_eq!(out.lineage.spans()[1].first, 104);
        let _ = Schema::empty();
    }

    fn erasing(p: f64, scale: [f64; 2], ratio: [f64; 2]) -> ImageOp {
        ImageOp::RandomErasing {
            p,
            scale,
            ratio,
            value: EraseValue::Values(vec![-7.5]),
        }
    }

    #[test]
    fn random_erasing_sets_one_drawn_box_and_leaves_the_rest() {
        // 6×8 RGB, crop (padding 1) + flip + normalize, then erase a quarter of the area
        // (12 pixels) as a square (ratio 1): √12 = 3.46, rounded to a 3×3 box.
        let shape = [6, 8, 3];
        let input = || batch(shape, 200, |r, y, x, c| (r * 7 + y * 20 + x * 3 + c) as u8);
        let ops = |erase: Option<ImageOp>| {
            let mut v = vec![
                ImageOp::RandomCrop {
                    size: [6, 8],
                    padding: 1,
                    padding_mode: PaddingMode::Constant,
                    pad_if_needed: false,
                    fill: PadFill::default(),
                },
                ImageOp::HorizontalFlip { p: 0.5 },
                identity(3),
            ];
            v.extend(erase);
            v
        };
        let plain = build_stage(shape, &input(), ops(None), OnError::Fail, ImageFormat::Raw);
        let st = build_stage(
            shape,
            &input(),
            ops(Some(erasing(0.5, [0.25, 0.25], [1.0, 1.0]))),
            OnError::Fail,
            ImageFormat::Raw,
        );
        let ids = row_ids(&input().lineage);
        let (a, b) = (plain.apply(input()).unwrap(), st.apply(input()).unwrap());
        let mut erased = 0;
        let mut tops = std::collections::BTreeSet::new();
        for (r, id) in ids.iter().enumerate() {
            let mut rng = ChaCha8Rng::from_seed(st.key);
            rng.set_stream(*id);
            let _ = st.draw(&mut rng, 6, 8);
            let e = st.draw_erase(&mut rng, [6, 8]);
            let (want, got) = (row(&a, r), row(&b, r));
            let inside = |y: usize, x: usize| {
                e.is_some_and(|e| {
                    (e.top..e.top + 3).contains(&y) && (e.left..e.left + 3).contains(&x)
                })
            };
            if let Some(e) = e {
                erased += 1;
                tops.insert((e.top, e.left));
                assert_eq!((e.height, e.width), (3, 3));
                assert_eq!(e.value, &EraseValue::Values(vec![-7.5]));
                assert!(e.top <= 3 && e.left <= 5, "{e:?}");
            }
            for k in 0..3 {
                for y in 0..6 {
                    for x in 0..8 {
                        let i = k * 48 + y * 8 + x;
                        let expect = if inside(y, x) { -7.5 } else { want[i] };
                        assert_eq!(got[i], expect, "row {r} channel {k} ({y}, {x}), {e:?}");
                    }
                }
            }
        }
        // p = 0.5 of 200 rows; the boxes land in many places (4 × 6 possible).
        assert!((70..=130).contains(&erased), "{erased} of 200 erased");
        assert!(tops.len() >= 12, "{tops:?}");
    }

    /// `value` per channel, and `random`: standard normal noise in the box (drawn from the
    /// row's stream, so the same in any batch), the rest untouched.
    #[test]
    fn random_erasing_values_per_channel_and_random() {
        let shape = [6, 8, 3];
        let input = || batch(shape, 200, |r, y, x, c| (r * 7 + y * 20 + x * 3 + c) as u8);
        let stage = |value| {
            let erase = ImageOp::RandomErasing {
                p: 0.5,
                scale: [0.25, 0.25],
                ratio: [1.0, 1.0],
                value,
            };
            build_stage(
                shape,
                &input(),
                vec![identity(3), erase],
                OnError::Fail,
                ImageFormat::Raw,
            )
        };
        let base = build_stage(
            shape,
            &input(),
            vec![identity(3)],
            OnError::Fail,
            ImageFormat::Raw,
        )
        .apply(input())
        .unwrap();
        let per_channel = stage(EraseValue::Values(vec![1.0, 2.0, 3.0]));
        let random = stage(EraseValue::Random);
        let (a, b) = (
            per_channel.apply(input()).unwrap(),
            random.apply(input()).unwrap(),
        );
        let ids = row_ids(&input().lineage);
        let mut noise = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            // Same key and ops but the value: the same boxes in both stages.
            let mut rng = ChaCha8Rng::from_seed(random.key);
            rng.set_stream(*id);
            let _ = random.draw(&mut rng, 6, 8);
            let e = random.draw_erase(&mut rng, [6, 8]);
            let (want, pc, rn) = (row(&base, r), row(&a, r), row(&b, r));
            for k in 0..3 {
                for y in 0..6 {
                    for x in 0..8 {
                        let i = k * 48 + y * 8 + x;
                        let inside = e.is_some_and(|e| {
                            (e.top..e.top + 3).contains(&y) && (e.left..e.left + 3).contains(&x)
                        });
                        if inside {
                            assert_eq!(pc[i], (k + 1) as f32, "row {r} channel {k}");
                            noise.push(f64::from(rn[i]));
                        } else {
                            assert_eq!((pc[i], rn[i]), (want[i], want[i]), "row {r}");
                        }
                    }
                }
            }
        }
        let n = noise.len() as f64;
        let mean = noise.iter().sum::<f64>() / n;
        let var = noise.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        assert!(n > 2000.0, "{n} noise values");
        assert!(
            mean.abs() < 0.1 && (0.85..1.15).contains(&var),
            "mean {mean}, var {var}"
        );
        // The noise belongs to the row: the same when the rows come in other batches.
        let parts =
            [input().slice(0, 77), input().slice(77, 123)].map(|p| random.apply(p).unwrap());
        for r in 0..200 {
            let (p, i) = if r < 77 {
                (&parts[0], r)
            } else {
                (&parts[1], r - 77)
            };
            assert_eq!(row(p, i), row(&b, r), "row {r}");
        }
        // One value per channel, or one for all.
        let e = refusal(
            shape,
            &input(),
            vec![ImageOp::RandomErasing {
                p: 0.5,
                scale: [0.02, 0.33],
                ratio: [0.3, 3.3],
                value: EraseValue::Values(vec![1.0, 2.0]),
            }],
        );
        assert!(
            e.contains("`value` has 2 values; give one, or one per channel (3)"),
            "{e}"
        );
    }

    #[test]
    fn random_erasing_that_never_fits_or_never_fires_changes_nothing() {
        let shape = [4, 4, 1];
        let input = || batch(shape, 50, |r, y, x, _| (r + y * 4 + x) as u8);
        let plain = build_stage(
            shape,
            &input(),
            vec![identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let want = plain.apply(input()).unwrap();
        // The whole area never fits (the box must be smaller than the image); p = 0 never
        // draws a box.
        for op in [
            erasing(1.0, [1.0, 1.0], [1.0, 1.0]),
            erasing(0.0, [0.1, 0.3], [0.3, 3.3]),
        ] {
            let st = build_stage(
                shape,
                &input(),
                vec![identity(1), op],
                OnError::Fail,
                ImageFormat::Raw,
            );
            let got = st.apply(input()).unwrap();
            for r in 0..50 {
                assert_eq!(row(&got, r), row(&want, r), "row {r}");
            }
        }
    }

    #[test]
    fn random_erasing_settings_and_place_are_checked() {
        let shape = [4, 4, 1];
        let input = batch(shape, 1, |_, _, _, _| 0);
        for (ops, expected) in [
            (
                vec![erasing(0.5, [0.02, 0.33], [0.3, 3.3]), identity(1)],
                "`normalize` is listed after `random_erasing`, but the ops apply in this order",
            ),
            (
                vec![erasing(1.5, [0.02, 0.33], [0.3, 3.3])],
                "`p` must be in [0, 1]",
            ),
            (
                vec![erasing(0.5, [0.0, 0.33], [0.3, 3.3])],
                "`scale` must satisfy",
            ),
            (
                vec![erasing(0.5, [0.02, 0.33], [3.3, 0.3])],
                "`ratio` must satisfy",
            ),
        ] {
            let e = refusal(shape, &input, ops);
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn center_crop_cuts_the_middle_like_torchvision() {
        // 5×7 image: (y, x) holds 10 y + x + 1 (0 is left for padding), every channel.
        for ch in [1, 3] {
            let shape = [5, 7, ch];
            let input = batch(shape, 2, |_, y, x, _| (10 * y + x + 1) as u8);
            // [size], its first source row and column (torchvision: round((n - size) / 2)
            // half to even when smaller, −⌊(size − n) / 2⌋ when larger).
            for (size, top, left) in [
                ([4, 4], 0, 2),
                ([5, 7], 0, 0),
                ([6, 3], 0, 2),
                ([8, 9], -1, -1),
                ([1, 2], 2, 2),
            ] {
                let st = build_stage(
                    shape,
                    &input,
                    vec![ImageOp::CenterCrop { size }, identity(ch)],
                    OnError::Fail,
                    ImageFormat::Raw,
                );
                let v = row(&st.apply(input.clone()).unwrap(), 1);
                let [oh, ow] = size;
                for k in 0..ch {
                    for y in 0..oh {
                        for x in 0..ow {
                            let (sy, sx) = (y as i64 + top, x as i64 + left);
                            let want = if (0..5).contains(&sy) && (0..7).contains(&sx) {
                                (10 * sy + sx + 1) as f32
                            } else {
                                0.0
                            };
                            assert_eq!(
                                v[(k * oh + y) * ow + x],
                                want,
                                "{ch} channel(s), size {size:?} at ({y}, {x})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn resize_is_the_whole_image_resized() {
        let shape = [4, 4, 1];
        let input = batch(shape, 2, |r, y, x, _| (r * 50 + y * 4 + x) as u8);
        let run = |op: ImageOp| {
            let st = build_stage(
                shape,
                &input,
                vec![op, identity(1)],
                OnError::Fail,
                ImageFormat::Raw,
            );
            let out = st.apply(input.clone()).unwrap();
            (row(&out, 0), row(&out, 1))
        };
        // To its own size: the image itself.
        let same = run(ImageOp::Resize { size: [4, 4] });
        assert_eq!(same.1, (0..16).map(|v| (50 + v) as f32).collect::<Vec<_>>());
        // Up: the same bilinear values as a random resized crop that must take the whole
        // (square) image.
        let whole = |size| ImageOp::RandomResizedCrop {
            size,
            scale: [1.0, 1.0],
            ratio: [1.0, 1.0],
        };
        for size in [[8, 8], [2, 2], [3, 6]] {
            let got = run(ImageOp::Resize { size });
            assert_eq!(got.0.len(), size[0] * size[1]);
            if size[0] == size[1] {
                assert_eq!(got, run(whole(size)), "{size:?}");
            }
        }
    }

    #[test]
    fn hue_shifts_around_the_colour_wheel_like_torchvision() {
        let px = |rgb: [f32; 3], shift: f32| {
            let mut p = rgb;
            shift_hue(&mut p, shift);
            p
        };
        let close = |a: [f32; 3], b: [f32; 3]| a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-3);
        // Red → yellow (1/6) → green (1/3) → blue (2/3, or -1/3) and back to red (1).
        assert!(close(px([255.0, 0.0, 0.0], 1.0 / 6.0), [255.0, 255.0, 0.0]));
        assert!(close(px([255.0, 0.0, 0.0], 1.0 / 3.0), [0.0, 255.0, 0.0]));
        assert!(close(px([255.0, 0.0, 0.0], -1.0 / 3.0), [0.0, 0.0, 255.0]));
        assert!(close(px([255.0, 0.0, 0.0], 0.5), [0.0, 255.0, 255.0]));
        // Saturation and value are kept: (200, 100, 50) is h 1/18, s 0.75, v 200; + 1/3 is
        // h 7/18, in the green-to-cyan sixth at 1/3 of it → (50, 200, 200 (1 − 0.75 · 2/3)).
        let shifted = px([200.0, 100.0, 50.0], 1.0 / 3.0);
        assert!(close(shifted, [50.0, 200.0, 100.0]), "{shifted:?}");
        // Greys have no hue.
        assert_eq!(px([90.0, 90.0, 90.0], 0.25), [90.0, 90.0, 90.0]);
    }

    #[test]
    fn hue_and_grayscale_draw_within_their_settings() {
        let shape = [2, 2, 3];
        let input = batch(shape, 400, |r, y, x, c| {
            ((r * 13 + y * 50 + x * 30 + c * 80) % 256) as u8
        });
        let st = build_stage(
            shape,
            &input,
            vec![
                ImageOp::ColorJitter {
                    brightness: 0.0,
                    contrast: 0.0,
                    saturation: 0.0,
                    hue: 0.1,
                },
                ImageOp::RandomGrayscale { p: 0.25 },
                identity(3),
            ],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let ids = row_ids(&input.lineage);
        let out = st.apply(input).unwrap();
        let mut greys = 0;
        for (r, id) in ids.iter().enumerate() {
            let mut rng = ChaCha8Rng::from_seed(st.key);
            rng.set_stream(*id);
            let (_, c) = st.draw(&mut rng, 2, 2);
            assert!(c.hue.abs() <= 0.1 && c.hue != 0.0, "{c:?}");
            let v = row(&out, r);
            if c.grey {
                greys += 1;
                // Every pixel grey: its three channel planes agree.
                for i in 0..4 {
                    assert_eq!((v[i], v[4 + i]), (v[8 + i], v[8 + i]), "row {r} pixel {i}");
                }
            }
        }
        assert!((70..=130).contains(&greys), "{greys} of 400 grey");
    }

    #[test]
    fn jitter_order_is_a_uniform_permutation_applied_as_drawn() {
        let jitter = |brightness, contrast, saturation, hue| ImageOp::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        };
        let shape = [2, 2, 3];
        let input = batch(shape, 2400, |_, _, _, _| 0);
        let ids = row_ids(&input.lineage);
        let orders = |op: ImageOp| -> Vec<[Adjust; 4]> {
            let st = build_stage(
                shape,
                &input,
                vec![op, identity(3)],
                OnError::Fail,
                ImageFormat::Raw,
            );
            ids.iter()
                .map(|id| {
                    let mut rng = ChaCha8Rng::from_seed(st.key);
                    rng.set_stream(*id);
                    st.draw(&mut rng, 2, 2).1.order
                })
                .collect()
        };
        // All four on: each of the 24 orders ~100 times of 2400 (σ ≈ 9.8).
        let mut counts = std::collections::HashMap::new();
        for o in orders(jitter(0.4, 0.4, 0.4, 0.1)) {
            *counts.entry(o).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 24, "{counts:?}");
        assert!(
            counts.values().all(|&n| (60..=140).contains(&n)),
            "{counts:?}"
        );
        // One on: nothing to order, nothing drawn.
        assert!(
            orders(jitter(0.4, 0.0, 0.0, 0.0))
                .iter()
                .all(|o| *o == NO_COLOUR.order)
        );

        // Applied in the drawn order, by hand: pixels 100 and 200 of a grey image, brightness
        // ×2 and contrast ×0.5.
        let grey = batch([1, 2, 1], 1, |_, _, _, _| 0);
        let st = build_stage(
            [1, 2, 1],
            &grey,
            vec![jitter(0.9, 0.9, 0.0, 0.0), identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let run = |order| {
            let mut px = [100.0f32, 200.0];
            let c = Colour {
                brightness: 2.0,
                contrast: 0.5,
                order,
                ..NO_COLOUR
            };
            st.colour(&mut px, &c);
            px
        };
        use Adjust::*;
        // Brightness first: [200, 255 (400 clamped)], mean 227.5, halved around it.
        assert_eq!(
            run([Brightness, Contrast, Saturation, Hue]),
            [213.75, 241.25]
        );
        // Contrast first: mean 150 → [125, 175], then doubled: [250, 255 (350 clamped)].
        assert_eq!(run([Hue, Contrast, Saturation, Brightness]), [250.0, 255.0]);
    }

    #[test]
    fn colour_settings_are_checked() {
        let rgb = batch([2, 2, 3], 1, |_, _, _, _| 0);
        let grey = batch([2, 2, 1], 1, |_, _, _, _| 0);
        let jitter = |hue: f64| ImageOp::ColorJitter {
            brightness: 0.0,
            contrast: 0.0,
            saturation: 0.0,
            hue,
        };
        for (input, shape, ops, expected) in [
            (
                &rgb,
                [2, 2, 3],
                vec![jitter(0.6)],
                "`hue` must be in [0, 0.5]",
            ),
            (&grey, [2, 2, 1], vec![jitter(0.1)], "need 3 channels"),
            (
                &grey,
                [2, 2, 1],
                vec![ImageOp::RandomGrayscale { p: 0.5 }],
                "random_grayscale needs 3 channels",
            ),
            (
                &rgb,
                [2, 2, 3],
                vec![ImageOp::RandomGrayscale { p: 1.5 }],
                "`p` must be in [0, 1]",
            ),
            (
                &rgb,
                [2, 2, 3],
                vec![ImageOp::RandomGrayscale { p: 0.5 }, jitter(0.1)],
                "`color_jitter` is listed after `random_grayscale`, but the ops apply in this order",
            ),
            // Listed after `normalize`, the jitter would read as working on normalized
            // values; the stage jitters pixels, so the list must say so.
            (
                &rgb,
                [2, 2, 3],
                vec![identity(3), jitter(0.1)],
                "`color_jitter` is listed after `normalize`",
            ),
            // A second jitter would be applied once, not twice.
            (
                &rgb,
                [2, 2, 3],
                vec![jitter(0.1), jitter(0.2)],
                "`color_jitter` is listed twice",
            ),
            // Every op's problem at once, in the order of the list.
            (
                &grey,
                [2, 2, 1],
                vec![
                    ImageOp::RandomGrayscale { p: 1.5 },
                    jitter(0.6),
                    ImageOp::HorizontalFlip { p: 2.0 },
                ],
                "4 problems in `ops`: (1) `color_jitter` is listed after `random_grayscale`, but the ops apply in this order: the geometry (a crop or resize, flips), then color_jitter, random_grayscale (on the cut window, padding included), normalize (pixels to the model's scale), random_erasing (on the normalized output); list them in that order; (2) random_grayscale: `p` must be in [0, 1], not 1.5; (3) color_jitter: `hue` must be in [0, 0.5], not 0.6; (4) flip: `p` must be in [0, 1], not 2",
            ),
        ] {
            let e = refusal(shape, input, ops);
            assert!(e.contains(expected), "{e}");
        }
    }

    /// `random_crop`'s `size`, `fill` and `pad_if_needed` are checked when the stage is built.
    #[test]
    fn crop_settings_are_checked_with_the_reason() {
        let input = batch([4, 4, 3], 1, |_, _, _, _| 0);
        let crop = |size, mode, pad_if_needed, fill: Vec<f32>| ImageOp::RandomCrop {
            size,
            padding: 1,
            padding_mode: mode,
            pad_if_needed,
            fill: PadFill(fill),
        };
        use PaddingMode::*;
        for (op, expected) in [
            (
                crop([7, 6], Constant, false, vec![0.0]),
                "size [7, 6] is larger than the padded image (6×6); set `pad_if_needed: true`",
            ),
            (
                crop([4, 4], Constant, false, vec![1.0, 2.0]),
                "`fill` has 2 values; give one, or one per channel (3)",
            ),
            (
                crop([4, 4], Constant, false, vec![256.0]),
                "`fill` is in pixel values, 0 to 255, not 256",
            ),
            (
                crop([4, 4], Reflect, false, vec![128.0]),
                "with `padding_mode: reflect` the padding repeats the image, so leave `fill` out",
            ),
        ] {
            let e = refusal([4, 4, 3], &input, vec![op]);
            assert!(e.contains(expected), "{e}");
        }
        // Larger than the padded image is fine with `pad_if_needed`.
        let st = build_stage(
            [4, 4, 3],
            &input,
            vec![crop([7, 6], Edge, true, vec![0.0])],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = st.apply(input).unwrap();
        assert_eq!(row(&out, 0).len(), 3 * 7 * 6);
    }

    /// `dead_letter` holds what `on_error: skip` removes, in files.
    #[test]
    fn dead_letter_needs_skip_and_a_file() {
        let input = batch([2, 2, 3], 1, |_, _, _, _| 0);
        let with = |on_error, dl| {
            let mut c = config([2, 2, 3], vec![], on_error, ImageFormat::Raw);
            c.dead_letter = Some(dl);
            build(
                &stage_ref(),
                &c,
                &input.data.schema(),
                &crate::stage::BuildContext::default(),
            )
            .map(|_| ())
            .unwrap_err()
            .to_string()
        };
        let file = crate::config::DeadLetterConfig::File(crate::config::DeadLetterFile {
            path: "bad/".into(),
            storage: Default::default(),
        });
        let e = with(OnError::Fail, file);
        assert!(
            e.contains(
                "`dead_letter` takes the rows `on_error: skip` removes: set `on_error: skip` too"
            ),
            "{e}"
        );
        let kafka = crate::config::DeadLetterConfig::Kafka(crate::config::DeadLetterKafka {
            topic: "bad".into(),
            brokers: None,
            properties: Default::default(),
        });
        let e = with(OnError::Skip, kafka);
        assert!(e.contains("writes its dead letters to files"), "{e}");
    }
}
