//! Decoding: a row's bytes from the image column, and raw, PNG or JPEG bytes to HWC `u8`
//! pixels.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, UInt8Type};

use super::ImageFormat;
#[cfg(feature = "image")]
use super::ImageOp;
use super::ImageStage;

/// The bytes of row `r` of an image column (`None`: null).
pub(super) fn raw_bytes(col: &ArrayRef, r: usize) -> Option<&[u8]> {
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

impl ImageStage {
    /// Decodes one row into HWC u8 pixels: borrowed for raw, owned for PNG/JPEG.
    pub(super) fn decode<'a>(
        &self,
        bytes: &'a [u8],
        owned: &'a mut Vec<u8>,
    ) -> std::result::Result<(&'a [u8], usize, usize), String> {
        let [h, w, ch] = self.shape;
        if self.format == ImageFormat::Raw {
            if bytes.len() != h * w * ch {
                return Err(format!(
                    "{} bytes, but shape [{h}, {w}, {ch}] needs {}",
                    bytes.len(),
                    h * w * ch
                ));
            }
            return Ok((bytes, h, w));
        }
        self.decode_coded(bytes, owned)
    }

    /// Decodes a PNG or JPEG row (`image` feature).
    #[cfg(feature = "image")]
    fn decode_coded<'a>(
        &self,
        bytes: &'a [u8],
        owned: &'a mut Vec<u8>,
    ) -> std::result::Result<(&'a [u8], usize, usize), String> {
        let [h, w, ch] = self.shape;
        let format = match self.format {
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::Raw | ImageFormat::Auto => {
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

    /// A build without the `image` feature refuses coded images when the stage is built; a
    /// row can only get here if that check is bypassed.
    #[cfg(not(feature = "image"))]
    fn decode_coded<'a>(
        &self,
        _bytes: &'a [u8],
        _owned: &'a mut Vec<u8>,
    ) -> std::result::Result<(&'a [u8], usize, usize), String> {
        Err(crate::error::feature_off(
            "decoding PNG/JPEG images",
            "image",
        ))
    }
}
