//! `random_erasing`: the box drawn per row, and erasing it in the finished output.

use chacha20::ChaCha8Rng;
use rand::RngExt;

use super::ImageStage;
use super::draw::box_attempt;
use super::{EraseValue, ImageOp};

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
    pub(super) fn apply(&self, dst: &mut [f32], [oh, ow]: [usize; 2], rng: &mut ChaCha8Rng) {
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
}
