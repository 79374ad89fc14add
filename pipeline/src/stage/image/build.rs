//! Building an `image` stage from its config: the column, the shape and every op checked
//! against the input schema, and the output schema.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, SchemaRef};

use super::device::DeviceImage;
use super::settings::{
    AugmentOn, EraseValue, ImageConfig, ImageDtype, ImageFormat, ImageOp, OnError, PadFill,
    PaddingMode,
};
use super::{ImageDeadLetter, ImageStage};
use crate::config::DeadLetterConfig;
use crate::dead_letter::DeadLetterFiles;
use crate::error::{Error, Result, StageRef};
use crate::runtime::recycle::F32Pool;
use crate::stage::{Build, BuiltStage, StageKind};

/// `type: image`: decoding and augmentation run on the CPU pool.
impl StageKind for ImageConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let (built, schema) = build(b.stage, self, b.input, b.ctx)?;
        Ok((BuiltStage::Map(Arc::new(built)), schema))
    }

    fn removes_rows(&self) -> bool {
        self.on_error == OnError::Skip
    }

    fn removed_as(&self) -> &'static str {
        "bad images skipped (on_error: skip)"
    }
}

/// Free output buffers the stage keeps for reuse (about ten batches of 256 CIFAR images).
const RETAIN_BYTES: usize = 32 << 20;

/// Checks the config against the input schema; returns the stage and its output schema.
pub(super) fn build(
    stage: &StageRef,
    c: &ImageConfig,
    input: &SchemaRef,
    ctx: &crate::stage::BuildContext,
) -> Result<(ImageStage, SchemaRef)> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
    if c.format != ImageFormat::Raw && !cfg!(feature = "image") {
        return Err(err(crate::error::feature_off(
            "`format: png | jpeg | auto` (decoding PNG/JPEG images)",
            "image",
        )));
    }
    let i = crate::stage::column_index(stage, input, &c.column)?;
    check_column(c, input.field(i).data_type()).map_err(err)?;
    let ch = c.shape[2];
    let Settled {
        out_hw,
        mut scale,
        mut bias,
        fill,
        ..
    } = check_ops(c).map_err(err)?;
    if c.dtype == ImageDtype::Uint8 {
        if let Some(op) = c
            .ops
            .iter()
            .find(|o| matches!(o, ImageOp::Normalize { .. } | ImageOp::RandomErasing { .. }))
        {
            return Err(err(format!(
                "`{}` works on normalized floats, and `dtype: uint8` hands out 0–255 pixels: remove it and normalize on the device (sluice.torch.normalize, in this stage's arithmetic), or leave out `dtype`",
                op.name()
            )));
        }
        // Pixel values through the float pass, rounded to bytes at the end.
        scale = vec![1.0; ch];
        bias = vec![0.0; ch];
    }
    let dead_letter = open_dead_letter(stage, c, ctx)?;
    let device = (c.augment_on == AugmentOn::Device)
        .then(|| device_spec(c, out_hw, &scale, &bias, &fill))
        .transpose()
        .map_err(err)?;
    let (schema, output, replace) =
        output_schema(c, input, i, out_hw, device.as_ref()).map_err(err)?;
    Ok((
        ImageStage {
            stage: stage.clone(),
            input: i,
            output,
            replace,
            format: c.format,
            dtype: c.dtype,
            deferred: device.is_some(),
            shape: c.shape,
            out_hw,
            ops: c.ops.clone(),
            key: crate::stage::augment::column_key(c.seed, stage.index, &c.column),
            on_error: c.on_error,
            schema: schema.clone(),
            dead_letter,
            pad_value: (0..ch).map(|k| fill[k] * scale[k] + bias[k]).collect(),
            fill,
            scale,
            bias,
            buffers: F32Pool::new(RETAIN_BYTES),
            pixel_buffers: crate::runtime::recycle::Pool::new(RETAIN_BYTES / 4),
            half_buffers: crate::runtime::recycle::Pool::new(RETAIN_BYTES / 2),
        },
        schema,
    ))
}

/// Checks the input column's type and the `shape` against each other and the `format`.
fn check_column(c: &ImageConfig, t: &DataType) -> std::result::Result<(), String> {
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
        return Err(format!(
            "column `{}` is {t}; image needs binary, fixed_size_binary or fixed_size_list<uint8> bytes",
            c.column
        ));
    }
    if u8_list && c.format != ImageFormat::Raw {
        return Err(format!(
            "column `{}` holds uint8 pixels (a list); use `format: raw`",
            c.column
        ));
    }
    let [h, w, ch] = c.shape;
    if h == 0 || w == 0 || !(ch == 1 || ch == 3) {
        return Err(format!(
            "`shape` is [height, width, channels] with channels 1 or 3, not {:?}",
            c.shape
        ));
    }
    if let (DataType::FixedSizeBinary(n) | DataType::FixedSizeList(_, n), ImageFormat::Raw) =
        (t, c.format)
        && *n as usize != h * w * ch
    {
        return Err(format!(
            "column `{}` holds {n} bytes per row but shape {:?} needs {}",
            c.column,
            c.shape,
            h * w * ch
        ));
    }
    Ok(())
}

/// What checking the ops settles: the output size, how many crops are listed, and per
/// channel the normalization (`v * scale + bias`) and `random_crop`'s fill (0–255).
#[derive(Debug)]
struct Settled {
    out_hw: [usize; 2],
    crops: usize,
    scale: Vec<f32>,
    bias: Vec<f32>,
    fill: Vec<f32>,
}

/// Checks `c.ops` for a `c.shape` input: the list as a whole, then each op's own settings.
fn check_ops(c: &ImageConfig) -> std::result::Result<Settled, String> {
    let [h, w, ch] = c.shape;
    let mut settled = Settled {
        out_hw: [h, w],
        crops: 0,
        scale: vec![1.0f32 / 255.0; ch],
        bias: vec![0.0f32; ch],
        fill: vec![0.0f32; ch],
    };
    // Every problem of the ops is reported at once (each op's own checks stop at its
    // first).
    let mut problems: Vec<String> = order_problems(&c.ops);
    for op in &c.ops {
        if let Err(problem) = check_op(op, c.shape, &mut settled) {
            problems.push(problem);
        }
    }
    if settled.crops > 1 {
        problems.push(
            "at most one crop (random_crop, random_resized_crop, center_crop or resize)".into(),
        );
    }
    match problems.len() {
        0 => {}
        1 => return Err(problems.remove(0)),
        n => {
            let listed: Vec<String> = problems
                .iter()
                .enumerate()
                .map(|(i, p)| format!("({}) {p}", i + 1))
                .collect();
            return Err(format!("{n} problems in `ops`: {}", listed.join("; ")));
        }
    }
    Ok(settled)
}

/// The problems of the list of ops as a whole: an op listed twice, or out of phase order.
fn order_problems(ops: &[ImageOp]) -> Vec<String> {
    // Each op applies once, in its phase (`ImageOp::phase`): a list naming one twice, or in
    // another order, would be applied otherwise than it reads, so it is refused.
    let mut problems: Vec<String> = Vec::new();
    if let Some(twice) = ops
        .iter()
        .enumerate()
        .find_map(|(k, op)| ops[..k].iter().any(|o| o.name() == op.name()).then_some(op))
    {
        problems.push(format!(
            "`{}` is listed twice: give it once (each op applies once)",
            twice.name()
        ));
    }
    if let Some((before, after)) = ops.iter().enumerate().find_map(|(k, op)| {
        ops[..k]
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
    problems
}

/// Checks one op's own settings for a `[h, w, ch]` input, stopping at its first problem, and
/// records in `settled` what it settles.
fn check_op(
    op: &ImageOp,
    [h, w, ch]: [usize; 3],
    settled: &mut Settled,
) -> std::result::Result<(), String> {
    match op {
        ImageOp::RandomCrop {
            size,
            padding,
            padding_mode,
            pad_if_needed,
            fill: PadFill(values),
        } => {
            settled.crops += 1;
            check_random_crop(
                size,
                *padding,
                padding_mode,
                *pad_if_needed,
                values,
                [h, w, ch],
            )?;
            settled.fill = (0..ch).map(|k| values[k % values.len()]).collect();
            settled.out_hw = *size;
        }
        ImageOp::RandomResizedCrop { size, scale, ratio } => {
            settled.crops += 1;
            check_resized_crop(size, scale, ratio)?;
            settled.out_hw = *size;
        }
        ImageOp::CenterCrop { size } | ImageOp::Resize { size } => {
            settled.crops += 1;
            if size[0] == 0 || size[1] == 0 {
                return Err(format!(
                    "{}: `size` must be positive",
                    if matches!(op, ImageOp::Resize { .. }) {
                        "resize"
                    } else {
                        "center_crop"
                    }
                ));
            }
            settled.out_hw = *size;
        }
        ImageOp::HorizontalFlip { p } | ImageOp::VerticalFlip { p } => {
            if !(0.0..=1.0).contains(p) {
                return Err(format!("flip: `p` must be in [0, 1], not {p}"));
            }
        }
        ImageOp::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => {
            check_jitter(brightness, contrast, saturation, hue, ch)?;
        }
        ImageOp::RandomGrayscale { p } => {
            if !(0.0..=1.0).contains(p) {
                return Err(format!("random_grayscale: `p` must be in [0, 1], not {p}"));
            }
            if ch != 3 {
                return Err("random_grayscale needs 3 channels".into());
            }
        }
        ImageOp::RandomErasing {
            p,
            scale,
            ratio,
            value,
        } => {
            check_erasing(p, scale, ratio, value, ch)?;
        }
        ImageOp::Normalize { mean, std } => {
            if mean.len() != ch || std.len() != ch {
                return Err(format!(
                    "normalize: give one `mean` and one `std` per channel ({ch})"
                ));
            }
            if std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
                return Err("normalize: every `std` must be positive".into());
            }
            for k in 0..ch {
                settled.scale[k] = (1.0 / (255.0 * std[k])) as f32;
                settled.bias[k] = (-mean[k] / std[k]) as f32;
            }
        }
    }
    Ok(())
}

/// Checks `random_crop`'s settings for a `[h, w, ch]` input.
fn check_random_crop(
    size: &[usize; 2],
    padding: usize,
    padding_mode: &PaddingMode,
    pad_if_needed: bool,
    values: &[f32],
    [h, w, ch]: [usize; 3],
) -> std::result::Result<(), String> {
    if size[0] == 0 || size[1] == 0 {
        return Err("random_crop: `size` must be positive".into());
    }
    if !pad_if_needed && (size[0] > h + 2 * padding || size[1] > w + 2 * padding) {
        return Err(format!(
            "random_crop: size {size:?} is larger than the padded image ({}×{}); set `pad_if_needed: true` to pad it up to the size",
            h + 2 * padding,
            w + 2 * padding
        ));
    }
    if values.len() != 1 && values.len() != ch {
        return Err(format!(
            "random_crop: `fill` has {} values; give one, or one per channel ({ch})",
            values.len()
        ));
    }
    if let Some(bad) = values.iter().find(|v| !(0.0..=255.0).contains(*v)) {
        return Err(format!(
            "random_crop: `fill` is in pixel values, 0 to 255, not {bad}"
        ));
    }
    if *padding_mode != PaddingMode::Constant && values.iter().any(|v| *v != 0.0) {
        return Err(format!(
            "random_crop: `fill` is what `constant` padding holds; with `padding_mode: {}` the padding repeats the image, so leave `fill` out",
            format!("{padding_mode:?}").to_lowercase()
        ));
    }
    Ok(())
}

/// Checks `random_resized_crop`'s settings.
fn check_resized_crop(
    size: &[usize; 2],
    scale: &[f64; 2],
    ratio: &[f64; 2],
) -> std::result::Result<(), String> {
    if size[0] == 0 || size[1] == 0 {
        return Err("random_resized_crop: `size` must be positive".into());
    }
    if !(0.0 < scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
        return Err(format!(
            "random_resized_crop: `scale` must satisfy 0 < min ≤ max ≤ 1, not {scale:?}"
        ));
    }
    if !(0.0 < ratio[0] && ratio[0] <= ratio[1]) {
        return Err(format!(
            "random_resized_crop: `ratio` must satisfy 0 < min ≤ max, not {ratio:?}"
        ));
    }
    Ok(())
}

/// Checks `color_jitter`'s settings for a `ch`-channel input.
fn check_jitter(
    brightness: &f64,
    contrast: &f64,
    saturation: &f64,
    hue: &f64,
    ch: usize,
) -> std::result::Result<(), String> {
    for (name, v) in [
        ("brightness", brightness),
        ("contrast", contrast),
        ("saturation", saturation),
    ] {
        if !(0.0..1.0).contains(v) {
            return Err(format!("color_jitter: `{name}` must be in [0, 1), not {v}"));
        }
    }
    if !(0.0..=0.5).contains(hue) {
        return Err(format!(
            "color_jitter: `hue` must be in [0, 0.5], not {hue}"
        ));
    }
    if (*saturation > 0.0 || *hue > 0.0) && ch != 3 {
        return Err("color_jitter: `saturation` and `hue` need 3 channels".into());
    }
    Ok(())
}

/// Checks `random_erasing`'s settings for a `ch`-channel input.
fn check_erasing(
    p: &f64,
    scale: &[f64; 2],
    ratio: &[f64; 2],
    value: &EraseValue,
    ch: usize,
) -> std::result::Result<(), String> {
    if !(0.0..=1.0).contains(p) {
        return Err(format!("random_erasing: `p` must be in [0, 1], not {p}"));
    }
    if !(0.0 < scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
        return Err(format!(
            "random_erasing: `scale` must satisfy 0 < min ≤ max ≤ 1, not {scale:?}"
        ));
    }
    if !(0.0 < ratio[0] && ratio[0] <= ratio[1] && ratio[1].is_finite()) {
        return Err(format!(
            "random_erasing: `ratio` must satisfy 0 < min ≤ max, not {ratio:?}"
        ));
    }
    if let EraseValue::Values(v) = value {
        if v.len() != 1 && v.len() != ch {
            return Err(format!(
                "random_erasing: `value` has {} values; give one, or one per channel ({ch})",
                v.len()
            ));
        }
        if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
            return Err(format!(
                "random_erasing: `value` must be finite numbers, not {bad}"
            ));
        }
    }
    Ok(())
}

/// Opens the dead-letter directory, if any: it takes the rows `on_error: skip` removes, and
/// an image stage writes it to files.
fn open_dead_letter(
    stage: &StageRef,
    c: &ImageConfig,
    ctx: &crate::stage::BuildContext,
) -> Result<Option<ImageDeadLetter>> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
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
    Ok(dead_letter)
}

/// The output schema: the input's, with the `ch`×`out_hw` float list in column `i` or
/// appended as `output`; and the list's column index and whether it replaces column `i`.
fn output_schema(
    c: &ImageConfig,
    input: &SchemaRef,
    i: usize,
    out_hw: [usize; 2],
    device: Option<&DeviceImage>,
) -> std::result::Result<(SchemaRef, usize, bool), String> {
    let out_name = c.output.clone().unwrap_or_else(|| c.column.clone());
    let [h, w, ch] = c.shape;
    let list = |t: DataType, k: usize| {
        DataType::FixedSizeList(Arc::new(Field::new_list_field(t, false)), k as i32)
    };
    let out_field = match (device, c.dtype) {
        (Some(d), _) => Field::new(&out_name, list(DataType::UInt8, h * w * ch), false)
            .with_metadata(d.metadata()),
        (None, dtype) => {
            let element = match dtype {
                ImageDtype::Float32 => DataType::Float32,
                ImageDtype::Uint8 => DataType::UInt8,
                ImageDtype::Float16 => DataType::Float16,
            };
            Field::new(&out_name, list(element, ch * out_hw[0] * out_hw[1]), false)
        }
    };
    let mut fields = crate::stage::owned_fields(input);
    let (output, replace) = if out_name == c.column {
        fields[i] = out_field;
        (i, true)
    } else {
        if input.index_of(&out_name).is_ok() {
            return Err(format!("output column `{out_name}` already exists"));
        }
        fields.push(out_field);
        (fields.len() - 1, false)
    };
    if let Some(d) = device {
        if fields.iter().any(|f| f.name() == &d.index) {
            return Err(format!(
                "`augment_on: device` adds the column `{}` (each row's source indices), which already exists; rename it or set `output`",
                d.index
            ));
        }
        fields.push(Field::new(
            &d.index,
            list(DataType::Int32, out_hw[0] + out_hw[1]),
            false,
        ));
    }
    let schema = Arc::new(arrow::datatypes::Schema::new(fields));
    Ok((schema, output, replace))
}

/// `augment_on: device`: the ops the loader can apply (an integer window, flips, normalize)
/// and what it needs to apply them.
fn device_spec(
    c: &ImageConfig,
    out_hw: [usize; 2],
    scale: &[f32],
    bias: &[f32],
    fill: &[f32],
) -> std::result::Result<DeviceImage, String> {
    if let Some(op) = c.ops.iter().find(|o| {
        !matches!(
            o,
            ImageOp::RandomCrop { .. }
                | ImageOp::CenterCrop { .. }
                | ImageOp::HorizontalFlip { .. }
                | ImageOp::VerticalFlip { .. }
                | ImageOp::Normalize { .. }
        )
    }) {
        return Err(format!(
            "`{}` runs only on the host; with `augment_on: device` the ops are random_crop, center_crop, horizontal_flip, vertical_flip and normalize (remove `augment_on` to run every op here)",
            op.name()
        ));
    }
    Ok(DeviceImage {
        shape: c.shape,
        out: out_hw,
        dtype: c.dtype,
        scale: scale.to_vec(),
        bias: bias.to_vec(),
        fill: fill.to_vec(),
        index: format!(
            "{}_index",
            c.output.clone().unwrap_or_else(|| c.column.clone())
        ),
    })
}
