//! The per-row draws of the geometry and colour ops from the row's stream, in op order.

use chacha20::ChaCha8Rng;
use rand::RngExt;

use super::ImageStage;
use super::colour::{Colour, NO_COLOUR};
use super::geometry::Geometry;
use super::{ImageOp, PaddingMode};

impl ImageStage {
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
                    let (top, left, chh, cw) = resized_crop_window(rng, h, w, scale, ratio);
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
                } => draw_jitter(&mut col, rng, brightness, contrast, saturation, hue),
                ImageOp::RandomGrayscale { p } => col.grey = rng.random::<f64>() < *p,
                // Drawn by `draw_erase`, after everything else (it is the last op).
                ImageOp::Normalize { .. } | ImageOp::RandomErasing { .. } => {}
            }
        }
        (g, col)
    }
}

/// `random_resized_crop`'s window `(top, left, height, width)` in an `h`×`w` image: up to 10
/// attempts drawn like torchvision, else the whole image centre-cropped to the ratio range.
fn resized_crop_window(
    rng: &mut ChaCha8Rng,
    h: usize,
    w: usize,
    scale: &[f64; 2],
    ratio: &[f64; 2],
) -> (usize, usize, usize, usize) {
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
    found.unwrap_or_else(|| {
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
    })
}

/// `color_jitter`'s draws into `col`: the order of its adjustments, then the brightness,
/// contrast, saturation and hue factors (each only when enabled).
fn draw_jitter(
    col: &mut Colour,
    rng: &mut ChaCha8Rng,
    brightness: &f64,
    contrast: &f64,
    saturation: &f64,
    hue: &f64,
) {
    let factor = |rng: &mut ChaCha8Rng, x: f64| -> f32 {
        if x > 0.0 {
            rng.random_range(1.0 - x..=1.0 + x) as f32
        } else {
            1.0
        }
    };
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

/// One torchvision-style attempt at a box (random resized crop, random erasing): an area of
/// `area · U(scale)` pixels and an aspect ratio `exp(U(ln ratio))` (the first bound when the
/// range is a single value), as `(round(√(area · aspect)), round(√(area / aspect)))`.
pub(super) fn box_attempt(
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
