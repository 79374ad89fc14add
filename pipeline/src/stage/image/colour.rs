//! Colour: the drawn `color_jitter` and `random_grayscale` factors, and applying them to a
//! row's 0–255 scratch buffer.

use super::ImageStage;

pub(super) const NO_COLOUR: Colour = Colour {
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

/// Shifts the hue of one RGB pixel (0–255) by `shift` of the colour wheel, through HSV as
/// torchvision's `adjust_hue` (`_rgb2hsv`, `(h + shift) mod 1`, `_hsv2rgb`).
pub(super) fn shift_hue(px: &mut [f32], shift: f32) {
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

impl ImageStage {
    /// Brightness, contrast, saturation and hue on the 0–255 scratch buffer, in the drawn
    /// order, clamping like torchvision (contrast blends with the mean grey level of the image
    /// as it is at that step, saturation with each pixel's grey), then grey.
    pub(super) fn colour(&self, scratch: &mut [f32], c: &Colour) {
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
}
