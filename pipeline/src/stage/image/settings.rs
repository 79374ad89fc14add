//! The `image` stage's settings: storage format, augmentation ops and their parameters, and
//! what to do with an image that cannot be decoded.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::config::DeadLetterConfig;

/// `type: image` — decodes an image column (raw HWC `uint8`, PNG, JPEG) and applies seeded
/// augmentation; the output is a `fixed_size_list<float32>` in CHW order. Every random
/// choice is a pure function of (seed, stage, epoch, row identity).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// The binary (or fixed-size binary) column holding the images.
    pub column: String,
    /// Output column. Default: replaces `column`.
    #[serde(default)]
    pub output: Option<String>,
    /// Storage format. Default: `raw`.
    #[serde(default)]
    pub format: ImageFormat,
    /// `[height, width, channels]`: the raw layout, and the size PNG/JPEG images must have
    /// (channels 1 or 3).
    pub shape: [usize; 3],
    /// Augmentation steps, in order (at most one crop).
    #[serde(default)]
    pub ops: Vec<ImageOp>,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Output element type. `float32` (default): CHW floats (`normalize` applied, else
    /// 0–1). `uint8`: CHW pixels 0–255 after the geometry and colour ops — a quarter of the
    /// bytes to move to a GPU, normalized there (`sluice.torch.normalize`: after crops, padding
    /// and flips bit for bit the values of `normalize` here, after a resize or colour op
    /// within half a pixel level); `normalize` and `random_erasing` are refused with it.
    /// `float16`: the float32 values rounded to float16 (half the bytes, for mixed precision).
    #[serde(default)]
    pub dtype: ImageDtype,
    /// Where the crop, the flips and `normalize` run. `host` (default): here, on the CPU
    /// pool. `device`: the stage decodes every image and draws its crop and flips here (the
    /// same draws as `host`, from the same seeded streams), but hands out the decoded HWC
    /// `uint8` pixels (a quarter of float32's bytes) and, in `<output>_index`, the source row
    /// and column each output pixel reads; the tensor loader then cuts, flips, converts and
    /// normalizes on the training device, bit for bit what `host` gives. Ops it takes:
    /// `random_crop`, `center_crop`, `horizontal_flip`, `vertical_flip`, `normalize`; every
    /// image must decode to `shape`.
    #[serde(default)]
    pub augment_on: AugmentOn,
    /// What to do with an undecodable image or wrong byte length. Default: `fail`.
    #[serde(default)]
    pub on_error: OnError,
    /// With `on_error: skip`: where the skipped rows also go (`{type: file, path: …}`), as
    /// JSON lines with their lineage, the error and the bytes. (Where they go does not
    /// change which rows come out: not part of the resume stamp.)
    #[serde(default, skip_serializing)]
    pub dead_letter: Option<DeadLetterConfig>,
}

/// The `image` stage's output element type.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ImageDtype {
    /// Normalized (or 0–1) float32.
    #[default]
    Float32,
    /// Pixels 0–255 (rounded after resizing or colour ops).
    Uint8,
    /// The float32 values rounded to float16 (IEEE binary16, to nearest, ties to even): half
    /// the bytes, for mixed-precision training (DALI's `crop_mirror_normalize` with
    /// `dtype=FLOAT16`).
    Float16,
}

/// Where the `image` stage's geometry and normalization run.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AugmentOn {
    /// On the CPU pool, in the stage.
    #[default]
    Host,
    /// In the tensor loader, as tensor ops on the training device (CUDA or CPU).
    Device,
}

/// How image bytes are stored.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormat {
    /// Raw interleaved HWC `uint8` pixels of the declared `shape`.
    #[default]
    Raw,
    /// PNG.
    Png,
    /// JPEG.
    Jpeg,
    /// PNG or JPEG, by magic bytes.
    Auto,
}

/// What `random_crop`'s padding holds (torchvision's `padding_mode`), for an image row
/// `a b c d`, padded by 2 on the left.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PaddingMode {
    /// Zeros: `0 0 | a b c d`.
    #[default]
    Constant,
    /// The edge pixel repeated: `a a | a b c d`.
    Edge,
    /// Mirrored without repeating the edge: `c b | a b c d`.
    Reflect,
    /// Mirrored, repeating the edge: `b a | a b c d`.
    Symmetric,
}

impl PaddingMode {
    /// The source index (of `n`) that position `i` reads under this mode; `None` when it is
    /// constant padding. Beyond one image width the pattern repeats (as numpy's `pad`).
    pub(crate) fn index(self, i: i64, n: usize) -> Option<usize> {
        let n_i = n as i64;
        if (0..n_i).contains(&i) {
            return Some(i as usize);
        }
        let j = match self {
            PaddingMode::Constant => return None,
            PaddingMode::Edge => i.clamp(0, n_i - 1),
            PaddingMode::Reflect if n == 1 => 0,
            PaddingMode::Reflect => {
                let m = i.rem_euclid(2 * (n_i - 1));
                if m < n_i { m } else { 2 * (n_i - 1) - m }
            }
            PaddingMode::Symmetric => {
                let m = i.rem_euclid(2 * n_i);
                if m < n_i { m } else { 2 * n_i - 1 - m }
            }
        };
        Some(j as usize)
    }
}

/// `random_crop`'s `fill`: one value per channel (a single number is used for every channel).
#[derive(Debug, Clone, PartialEq)]
pub struct PadFill(pub Vec<f32>);

impl Default for PadFill {
    fn default() -> Self {
        PadFill(vec![0.0])
    }
}

impl<'de> Deserialize<'de> for PadFill {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PadFill;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pixel value (0–255) or a list of them, one per channel")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<PadFill, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<f32>()? {
                    v.push(x);
                }
                Ok(PadFill(v))
            }
        }
        d.deserialize_any(V)
    }
}

// Serialized in the form its YAML takes, for the checkpoint stamp (see `OneOrMany`'s
// `Serialize` in `config/mod.rs`).
impl Serialize for PadFill {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// What the `image` stage does with a row it cannot decode.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the run, naming the row (file, row group, row).
    #[default]
    Fail,
    /// Drop the row, count it, and log its lineage and the reason (`records_bad`).
    Skip,
}

/// One augmentation step of an `image` stage. The stage applies them in phases — geometry
/// (a crop or resize, flips), colour (`color_jitter`, then `random_grayscale`), `normalize`,
/// `random_erasing` — and `ops` must list them in that order ([`ImageOp::phase`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum ImageOp {
    /// Pad every side with `padding` pixels (`padding_mode`), then cut a random `size` window.
    RandomCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
        /// Padding on each side. Default: 0.
        #[serde(default)]
        padding: usize,
        /// What the padding holds. Default: `constant` (`fill`).
        #[serde(default)]
        padding_mode: PaddingMode,
        /// Pad an image smaller than `size` (after `padding`) up to it: by the shortfall on
        /// both sides of that axis, like torchvision's `pad_if_needed`. Default: false (such
        /// an image is an error).
        #[serde(default)]
        pad_if_needed: bool,
        /// What `constant` padding holds, in pixel values (0–255): one number, or one per
        /// channel (torchvision's `fill`). Default: 0.
        #[serde(default)]
        fill: PadFill,
    },
    /// Cut a random area (fraction `scale` of the image, aspect ratio in `ratio`), resize
    /// (bilinear) to `size`.
    RandomResizedCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
        /// Area fraction range. Default: [0.08, 1.0].
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        /// Aspect ratio range (width / height). Default: [3/4, 4/3].
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    /// Cut the centre `size` window, zero-padded where it is larger than the image (like
    /// torchvision's `CenterCrop`): the deterministic crop, for evaluation.
    CenterCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
    },
    /// Resize the whole image (bilinear) to `size`.
    Resize {
        /// Output `[height, width]`.
        size: [usize; 2],
    },
    /// Mirror left-right with probability `p` (default 0.5).
    HorizontalFlip {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
    },
    /// Mirror top-bottom with probability `p` (default 0.5).
    VerticalFlip {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
    },
    /// Random brightness/contrast/saturation factors in `[1 - x, 1 + x]`, and a hue shift in
    /// `[-hue, hue]` (a fraction of the colour wheel).
    ColorJitter {
        /// Default: 0.
        #[serde(default)]
        brightness: f64,
        /// Default: 0.
        #[serde(default)]
        contrast: f64,
        /// Default: 0.
        #[serde(default)]
        saturation: f64,
        /// In `[0, 0.5]`. Default: 0.
        #[serde(default)]
        hue: f64,
    },
    /// Grey with probability `p` (default 0.1): every channel becomes the luma
    /// `0.299 R + 0.587 G + 0.114 B`, like torchvision's `RandomGrayscale`.
    RandomGrayscale {
        /// Probability. Default: 0.1.
        #[serde(default = "default_grayscale_p")]
        p: f64,
    },
    /// `(pixel / 255 - mean[c]) / std[c]` per channel.
    Normalize {
        /// Per-channel mean (of values scaled to [0, 1]).
        mean: Vec<f64>,
        /// Per-channel standard deviation.
        std: Vec<f64>,
    },
    /// With probability `p`, set a random box of the output (area fraction in `scale`, aspect
    /// ratio height / width in `ratio`) to `value` in every channel, like torchvision's
    /// `RandomErasing` after `Normalize` (Zhong et al., 2020). Must be the last op.
    RandomErasing {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
        /// Area fraction range. Default: [0.02, 0.33].
        #[serde(default = "default_erase_scale")]
        scale: [f64; 2],
        /// Aspect ratio range (height / width). Default: [0.3, 3.3].
        #[serde(default = "default_erase_ratio")]
        ratio: [f64; 2],
        /// What the box holds, in the output's units (after `normalize`: 0 is the mean): one
        /// value, one per channel, or `random` (standard normal noise per value, like
        /// torchvision's `value='random'`). Default: 0.
        #[serde(default)]
        value: EraseValue,
    },
}

impl ImageOp {
    /// The op's name in the config.
    pub fn name(&self) -> &'static str {
        match self {
            ImageOp::RandomCrop { .. } => "random_crop",
            ImageOp::RandomResizedCrop { .. } => "random_resized_crop",
            ImageOp::CenterCrop { .. } => "center_crop",
            ImageOp::Resize { .. } => "resize",
            ImageOp::HorizontalFlip { .. } => "horizontal_flip",
            ImageOp::VerticalFlip { .. } => "vertical_flip",
            ImageOp::ColorJitter { .. } => "color_jitter",
            ImageOp::RandomGrayscale { .. } => "random_grayscale",
            ImageOp::Normalize { .. } => "normalize",
            ImageOp::RandomErasing { .. } => "random_erasing",
        }
    }

    /// When the stage applies the op: 0 geometry (the window is cut and flipped while the
    /// pixels are sampled), 1 `color_jitter`, 2 `random_grayscale` (both on the cut window,
    /// padding included), 3 `normalize`, 4 `random_erasing` (on the finished output).
    pub fn phase(&self) -> u8 {
        match self {
            ImageOp::RandomCrop { .. }
            | ImageOp::RandomResizedCrop { .. }
            | ImageOp::CenterCrop { .. }
            | ImageOp::Resize { .. }
            | ImageOp::HorizontalFlip { .. }
            | ImageOp::VerticalFlip { .. } => 0,
            ImageOp::ColorJitter { .. } => 1,
            ImageOp::RandomGrayscale { .. } => 2,
            ImageOp::Normalize { .. } => 3,
            ImageOp::RandomErasing { .. } => 4,
        }
    }
}

/// What `random_erasing` writes into its box.
#[derive(Debug, Clone, PartialEq)]
pub enum EraseValue {
    /// One value per channel (a single number is used for every channel).
    Values(Vec<f32>),
    /// Standard normal noise, one draw per erased value.
    Random,
}

impl Default for EraseValue {
    fn default() -> Self {
        EraseValue::Values(vec![0.0])
    }
}

impl<'de> Deserialize<'de> for EraseValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EraseValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, a list of numbers (one per channel), or `random`")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<EraseValue, E> {
                match v {
                    "random" => Ok(EraseValue::Random),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<EraseValue, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<f32>()? {
                    v.push(x);
                }
                Ok(EraseValue::Values(v))
            }
        }
        d.deserialize_any(V)
    }
}

// Serialized in the form its YAML takes, for the checkpoint stamp (see `OneOrMany`'s
// `Serialize` in `config/mod.rs`).
impl Serialize for EraseValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EraseValue::Values(v) => v.serialize(s),
            EraseValue::Random => s.serialize_str("random"),
        }
    }
}

fn default_grayscale_p() -> f64 {
    0.1
}
fn default_erase_scale() -> [f64; 2] {
    [0.02, 0.33]
}
fn default_erase_ratio() -> [f64; 2] {
    [0.3, 3.3]
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_half() -> f64 {
    0.5
}
