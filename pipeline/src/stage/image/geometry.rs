//! Geometry: the window of the source a row's output reads (crop, padding, flips), the
//! antialiased resize weights, and the passes that sample pixels through it.

use super::ImageStage;
use super::PaddingMode;
use crate::stage::pixels;

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

impl Geometry {
    /// The integer crop window of an `exact` geometry, as the pixel kernels take it.
    pub(crate) fn window(&self) -> pixels::Window {
        pixels::Window {
            top: self.top as i64,
            left: self.left as i64,
            flip_h: self.flip_h,
            flip_v: self.flip_v,
        }
    }
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
    pub(super) fn source(&self, c: i64, n: usize, axis: usize) -> Option<usize> {
        let (p, q) = (self.inner[axis], self.outer[axis]);
        if q == 0 || matches!(self.pad, PaddingMode::Constant | PaddingMode::Edge) {
            return self.pad.index(c, n);
        }
        let j = self.pad.index(c + p as i64, n + 2 * p)?;
        self.pad.index(j as i64 - p as i64, n)
    }

    /// Whether the window lies within the `h`×`w` image (reads no padding).
    pub(super) fn inside(&self, h: usize, w: usize) -> bool {
        self.top >= 0.0
            && self.left >= 0.0
            && self.top + self.height <= h as f64
            && self.left + self.width <= w as f64
    }
}

impl ImageStage {
    /// The common case in one pass: an integer window (crop with padding, flips), no colour
    /// ops — HWC `u8` straight to normalized CHW `f32` in `dst` (one image), padding written
    /// as the normalized 0. Each source row is read once, contiguously. `streamed`: `dst` is
    /// a batch's buffer (written through a cached copy, then streamed); else a row the caller
    /// reads next (plain stores).
    pub(super) fn crop_normalize(
        &self,
        src: &[u8],
        h: usize,
        w: usize,
        g: &Geometry,
        dst: &mut [f32],
        streamed: bool,
    ) {
        let ch = self.shape[2];
        let win = g.window();
        if ch == 3 {
            let [scale, bias, pad] = self.rgb_constants();
            let crop = match streamed {
                true => pixels::rgb_crop,
                false => pixels::rgb_crop_cached,
            };
            crop(src, h, w, self.out_hw, &win, scale, bias, pad, dst);
            return;
        }
        let out = self.out_hw;
        let (scale, bias) = (&self.scale, &self.bias);
        pixels::crop_channels(src, [h, w, ch], out, &win, &self.pad_value, dst, |k, p| {
            f32::from(p) * scale[k] + bias[k]
        });
    }

    /// [`Self::crop_normalize`] of an RGB image rounded to float16 into `dst` (`dtype:
    /// float16`): in one pass where the CPU allows, through `scratch` (the image's length of
    /// floats) where not (`pixels::rgb_crop_f16`).
    pub(super) fn crop_f16(
        &self,
        src: &[u8],
        h: usize,
        w: usize,
        g: &Geometry,
        dst: &mut [half::f16],
        scratch: &mut [f32],
    ) {
        let win = g.window();
        let [scale, bias, pad] = self.rgb_constants();
        pixels::rgb_crop_f16(src, h, w, self.out_hw, &win, scale, bias, pad, dst, scratch);
    }

    /// An RGB stage's per-channel scale, bias and normalized padding value, as the RGB
    /// kernels take them.
    fn rgb_constants(&self) -> [[f32; 3]; 3] {
        [&self.scale, &self.bias, &self.pad_value].map(|v| [v[0], v[1], v[2]])
    }

    /// [`Self::crop_normalize`] for `dtype: uint8`: the window's pixels themselves, CHW,
    /// constant padding as `fill` (rounded, as the float path rounds it).
    pub(super) fn crop_pixels(&self, src: &[u8], h: usize, w: usize, g: &Geometry, dst: &mut [u8]) {
        let ch = self.shape[2];
        let win = g.window();
        // (Channels are 1 or 3: an array, not an allocation per image.)
        let pad = [0, 1, 2].map(|k| self.pad_value.get(k).map_or(0, |v| v.round() as u8));
        if ch == 3 {
            pixels::rgb_crop_u8(src, h, w, self.out_hw, &win, pad, dst);
            return;
        }
        let out = self.out_hw;
        pixels::crop_channels(src, [h, w, ch], out, &win, &pad[..ch], dst, |_, p| p);
    }

    /// Samples `src` (HWC u8, `h`×`w`) through `g` into `scratch` (HWC f32, 0–255 scale,
    /// output size); padding reads as `g.pad` says (constant: 0).
    pub(super) fn sample(
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
}
