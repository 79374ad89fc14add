//! Image columns of an `image` stage with `augment_on: device`: the crop, the flips, the fill,
//! the conversion and `normalize` as tensor ops on the training device (FFCV/DALI style), bit
//! for bit what the stage computes on the host.
//!
//! The stage drew every row's window on the host and wrote, per row, the source row of each
//! output row and the source column of each output column (`-1`: constant fill; padding modes
//! and flips already folded in). Here the decoded `uint8` HWC pixels cross to the device (a
//! quarter of float32's bytes) with those indices, and on the device: one gather
//! (`x[b, rows[b], cols[b]]`), the fill where an index is `-1`, then for float32 the
//! conversion and `v * scale + bias` per channel — a multiply and an add, each rounded to
//! float32, as the stage does them (for float16 the same, then rounded to nearest even).

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int32Type};
use sluice_pipeline::Batch;
use sluice_pipeline::stages::{DeviceImage, ImageDtype};
use tch::{Device, Kind, Tensor};

use super::convert::{to_device, values_tensor};

/// `[n, channels, out_h, out_w]` images of `col` (an `augment_on: device` column described by
/// `spec`) on `device`.
pub(super) fn image_tensor(
    batch: &Batch,
    col: &ArrayRef,
    spec: &DeviceImage,
    device: Device,
) -> Result<Tensor, String> {
    let n = batch.num_rows() as i64;
    let [h, w, c] = spec.shape.map(|v| v as i64);
    let [oh, ow] = spec.out.map(|v| v as i64);
    let per_row = (h * w * c) as usize;
    let DataType::FixedSizeList(_, k) = col.data_type() else {
        return Err(format!(
            "an augment_on: device image column holds fixed_size_list<uint8> pixels, not {}",
            col.data_type()
        ));
    };
    if *k as usize != per_row {
        return Err(format!(
            "rows hold {k} bytes, the image spec says [{h}, {w}, {c}]"
        ));
    }
    let list = col.as_fixed_size_list();
    let pixels = values_tensor(
        list.values(),
        list.offset() * per_row,
        n as usize * per_row,
        &[n, h, w, c],
        device == Device::Cpu,
    )?;
    let index = index_tensor(batch, spec, n, oh + ow)?;
    let torch = |e: tch::TchError| e.to_string();
    let pixels = to_device(pixels, device).map_err(|e| e.to_string())?;
    let index = to_device(index, device).map_err(|e| e.to_string())?;
    let rows = index.f_narrow(1, 0, oh).map_err(torch)?;
    let cols = index.f_narrow(1, oh, ow).map_err(torch)?;
    let valid = rows
        .f_ge(0)
        .map_err(torch)?
        .f_view([n, oh, 1, 1])
        .map_err(torch)?
        .f_logical_and(
            &cols
                .f_ge(0)
                .map_err(torch)?
                .f_view([n, 1, ow, 1])
                .map_err(torch)?,
        )
        .map_err(torch)?;
    let at = |t: &Tensor, shape: [i64; 3]| -> Result<Tensor, tch::TchError> {
        t.f_clamp_min(0)?.f_to_kind(Kind::Int64)?.f_view(shape)
    };
    let batch_index = Tensor::f_arange(n, (Kind::Int64, device))
        .map_err(torch)?
        .f_view([n, 1, 1])
        .map_err(torch)?;
    // [n, oh, ow, c]: the window, flipped and padded, in one gather.
    let cut = pixels
        .f_index(&[
            Some(batch_index),
            Some(at(&rows, [n, oh, 1]).map_err(torch)?),
            Some(at(&cols, [n, 1, ow]).map_err(torch)?),
        ])
        .map_err(torch)?;
    let out = match spec.dtype {
        ImageDtype::Uint8 => {
            // The host path rounds its float pass (the fill included) to bytes.
            let fill: Vec<u8> = spec.fill.iter().map(|f| f.round() as u8).collect();
            let fill = per_channel(&fill, device)?;
            cut.f_where_self(&valid, &fill).map_err(torch)?
        }
        ImageDtype::Float32 | ImageDtype::Float16 => {
            let (fill, scale, bias) = (
                per_channel(&spec.fill, device)?,
                per_channel(&spec.scale, device)?,
                per_channel(&spec.bias, device)?,
            );
            let x = cut
                .f_to_kind(Kind::Float)
                .and_then(|x| x.f_where_self(&valid, &fill))
                .and_then(|x| x.f_mul(&scale))
                .and_then(|x| x.f_add(&bias));
            // float16: the float32 values rounded to nearest, as the host path rounds them.
            match spec.dtype {
                ImageDtype::Float16 => x.and_then(|x| x.f_to_kind(Kind::Half)),
                _ => x,
            }
            .map_err(torch)?
        }
    };
    out.f_permute([0, 3, 1, 2])
        .and_then(|t| t.f_contiguous())
        .map_err(torch)
}

/// Per-channel values as a `[c]` tensor (broadcast over the channels-last cut) on `device`,
/// through the same pinned, non-blocking copy as the pixels: a pageable copy would wait for
/// the stream.
fn per_channel<T: tch::kind::Element>(v: &[T], device: Device) -> Result<Tensor, String> {
    to_device(Tensor::from_slice(v), device).map_err(|e| e.to_string())
}

/// The `[n, width]` int32 source indices of the rows of `batch`, from the spec's index column.
fn index_tensor(batch: &Batch, spec: &DeviceImage, n: i64, width: i64) -> Result<Tensor, String> {
    let col = batch.data.column_by_name(&spec.index).ok_or_else(|| {
        format!(
            "the column `{}` (each row's crop and flips, added by the image stage with `augment_on: device`) is missing: keep it through the stages after the image stage",
            spec.index
        )
    })?;
    let ok = matches!(col.data_type(), DataType::FixedSizeList(f, k)
        if f.data_type() == &DataType::Int32 && i64::from(*k) == width);
    if !ok || col.null_count() > 0 {
        return Err(format!(
            "the column `{}` is {}, not the image stage's fixed_size_list<int32>[{width}] of source indices",
            spec.index,
            col.data_type()
        ));
    }
    let list = col.as_fixed_size_list();
    let values = list.values().as_primitive::<Int32Type>().values();
    let at = list.offset() * width as usize;
    Tensor::f_from_slice(&values[at..at + (n * width) as usize])
        .and_then(|t| t.f_view([n, width]))
        .map_err(|e| e.to_string())
}
