//! Arrow columns → tch tensors (one copy each; see the module docs for why not zero-copy).

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    UInt8Type,
};
use sluice_pipeline::Batch;
use sluice_pipeline::stages::DeviceImage;
use tch::{Device, Kind, Tensor};

use super::{NullPolicy, TensorSpec};

/// Why a batch could not become tensors.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The `loader:` section is wrong.
    #[error("loader: {0}")]
    Config(String),
    /// A column cannot become the requested tensor.
    #[error("loader: tensor `{tensor}` from column `{column}`: {message}")]
    Column {
        /// Tensor name.
        tensor: String,
        /// Source column.
        column: String,
        /// What is wrong, with the row's lineage when a row is to blame.
        message: String,
    },
    /// libtorch refused an operation.
    #[error("loader: libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The pipeline failed.
    #[error("{0}")]
    Pipeline(String),
}

/// Element kind of an Arrow primitive type, if tensors can hold it.
pub(super) fn kind_of(t: &DataType) -> Option<Kind> {
    Some(match t {
        DataType::Float32 => Kind::Float,
        DataType::Float64 => Kind::Double,
        DataType::Float16 => Kind::Half,
        DataType::Int64 => Kind::Int64,
        DataType::Int32 => Kind::Int,
        DataType::Int16 => Kind::Int16,
        DataType::Int8 => Kind::Int8,
        DataType::UInt8 => Kind::Uint8,
        DataType::Boolean => Kind::Bool,
        _ => return None,
    })
}

/// A tensor of `len` values of a primitive array starting at `offset`: over the Arrow buffer
/// itself when `zero_copy` allows, else one copy; booleans are unpacked to one byte each.
pub(super) fn values_tensor(
    values: &ArrayRef,
    offset: usize,
    len: usize,
    shape: &[i64],
    zero_copy: bool,
) -> Result<Tensor, String> {
    macro_rules! prim {
        ($t:ty, $kind:expr) => {{
            let a = values.as_primitive::<$t>();
            if zero_copy {
                let size =
                    std::mem::size_of::<<$t as arrow::datatypes::ArrowPrimitiveType>::Native>();
                if let Some(t) = super::blob::tensor_over(
                    a.values().inner(),
                    offset * size,
                    len * size,
                    $kind,
                    shape,
                ) {
                    return Ok(t);
                }
            }
            let v = &a.values()[offset..offset + len];
            // Arrow's own safe view of plain numbers as bytes.
            let bytes: &[u8] = arrow::datatypes::ToByteSlice::to_byte_slice(v);
            Tensor::f_from_data_size(bytes, shape, $kind).map_err(|e| e.to_string())
        }};
    }
    match values.data_type() {
        DataType::Float32 => prim!(Float32Type, Kind::Float),
        DataType::Float64 => prim!(Float64Type, Kind::Double),
        DataType::Float16 => prim!(Float16Type, Kind::Half),
        DataType::Int64 => prim!(Int64Type, Kind::Int64),
        DataType::Int32 => prim!(Int32Type, Kind::Int),
        DataType::Int16 => prim!(Int16Type, Kind::Int16),
        DataType::Int8 => prim!(Int8Type, Kind::Int8),
        DataType::UInt8 => prim!(UInt8Type, Kind::Uint8),
        DataType::Boolean => {
            let b: &BooleanArray = values.as_boolean();
            let bytes: Vec<u8> = (offset..offset + len).map(|i| b.value(i) as u8).collect();
            Tensor::f_from_data_size(&bytes, shape, Kind::Bool).map_err(|e| e.to_string())
        }
        other => Err(format!("{other} values cannot become a tensor")),
    }
}

/// The array holding a column's values: a fixed-size list's child, else the column itself.
fn leaf_values(col: &ArrayRef) -> &ArrayRef {
    match col.data_type() {
        DataType::FixedSizeList(..) => col.as_fixed_size_list().values(),
        _ => col,
    }
}

/// Whether `spec`'s tensor keeps the kind `values` are stored as: no `dtype`, or the same.
fn keeps_kind(values: &ArrayRef, spec: &TensorSpec) -> bool {
    spec.dtype
        .is_none_or(|d| kind_of(values.data_type()) == Some(d.kind()))
}

/// Whether every tensor of `specs` can be made over `batch`'s own memory on `device`: the
/// host, every column a primitive or a fixed-size list of primitives without nulls, already
/// of the tensor's dtype (a primitive array's values are aligned for their type). Such a
/// conversion wraps buffers and copies nothing, so the loader makes it where it is, without
/// a trip through the CPU pool.
pub(super) fn shares_memory(
    batch: &Batch,
    specs: &BTreeMap<String, TensorSpec>,
    device: Device,
) -> bool {
    let schema = batch.data.schema();
    device == Device::Cpu
        && specs.values().all(|spec| {
            let Some(col) = batch.data.column_by_name(&spec.column) else {
                return false;
            };
            let values = leaf_values(col);
            let leaf = values.data_type();
            kind_of(leaf).is_some()
                && *leaf != DataType::Boolean
                && keeps_kind(values, spec)
                && col.null_count() == 0
                && values.null_count() == 0
                && (schema.field_with_name(&spec.column).ok())
                    .and_then(DeviceImage::of)
                    .is_none()
        })
}

/// Converts `batch` into the tensors of `specs`, on `device`.
pub fn batch_to_tensors(
    batch: &Batch,
    specs: &BTreeMap<String, TensorSpec>,
    device: Device,
) -> Result<BTreeMap<String, Tensor>, ConvertError> {
    let mut out = BTreeMap::new();
    let n = batch.num_rows();
    for (name, spec) in specs {
        let fail = |message: String| ConvertError::Column {
            tensor: name.clone(),
            column: spec.column.clone(),
            message,
        };
        let col = batch.data.column_by_name(&spec.column).ok_or_else(|| {
            let schema = batch.data.schema();
            fail(format!(
                "no such column; the batch has: {}{}",
                super::column_names(&schema),
                sluice_pipeline::config::did_you_mean(
                    &spec.column,
                    schema.fields().iter().map(|f| f.name().as_str())
                )
            ))
        })?;
        // An `image` stage's `augment_on: device` column: its ops run here, on the device.
        let schema = batch.data.schema();
        let field = schema.field_with_name(&spec.column).ok();
        if let Some(image) = field.and_then(DeviceImage::of) {
            let tensor = image
                .and_then(|image| super::device_image::image_tensor(batch, col, &image, device))
                .map_err(fail)?;
            out.insert(name.clone(), reshape_and_cast(tensor, spec, n, fail)?);
            continue;
        }
        let mut valid: Option<Tensor> = None;
        if col.null_count() > 0 {
            match spec.nulls {
                NullPolicy::Error => {
                    let row = (0..n).find(|r| col.is_null(*r)).unwrap_or(0);
                    return Err(fail(format!(
                        "row {} is null ({}); set `nulls: mask` to get zeros and a `{name}_valid` tensor",
                        row,
                        batch.lineage.describe_row(row as u64)
                    )));
                }
                NullPolicy::Mask => {
                    let v: Vec<u8> = (0..n).map(|r| col.is_valid(r) as u8).collect();
                    valid = Some(Tensor::f_from_data_size(&v, &[n as i64], Kind::Bool)?);
                }
            }
        }
        // Share the Arrow memory when nothing needs converting and the tensor stays on the
        // host (a device copy copies anyway); see `blob.rs` for why that is sound.
        let zero_copy =
            device == Device::Cpu && valid.is_none() && keeps_kind(leaf_values(col), spec);
        let (tensor, mask) = match col.data_type() {
            t if kind_of(t).is_some() => {
                let t =
                    values_tensor(col, col.offset(), n, &[n as i64], zero_copy).map_err(fail)?;
                (t, None)
            }
            DataType::FixedSizeList(_, k) => {
                let list = col.as_fixed_size_list();
                let k = *k as usize;
                let values = list.values();
                if values.null_count() > 0 && valid.is_none() {
                    return Err(fail("the lists hold null values".into()));
                }
                let t = values_tensor(
                    values,
                    list.offset() * k,
                    n * k,
                    &[n as i64, k as i64],
                    zero_copy,
                )
                .map_err(fail)?;
                (t, None)
            }
            DataType::List(_) | DataType::LargeList(_) => padded_lists(col, n, spec, fail)?,
            other => return Err(fail(format!("a {other} column cannot become a tensor"))),
        };
        let mut tensor = reshape_and_cast(tensor, spec, n, fail)?;
        if let Some(v) = &valid {
            // What a null row holds under its null is whatever the stages left there (a
            // list's values noised like any other, or zeros): `nulls: mask` promises zeros.
            let mut shape = vec![1i64; tensor.dim().max(1)];
            shape[0] = n as i64;
            tensor = tensor.f_masked_fill(&v.f_logical_not()?.f_view(shape.as_slice())?, 0)?;
        }
        out.insert(name.clone(), to_device(tensor, device)?);
        if let Some(m) = mask {
            out.insert(format!("{name}_mask"), to_device(m, device)?);
        }
        if let Some(v) = valid {
            out.insert(format!("{name}_valid"), to_device(v, device)?);
        }
    }
    Ok(out)
}

/// A `List` or `LargeList` column as one `[n, longest]` tensor padded with `pad`, and the
/// mask of the values each row really has.
fn padded_lists(
    col: &ArrayRef,
    n: usize,
    spec: &TensorSpec,
    fail: impl Fn(String) -> ConvertError + Copy,
) -> Result<(Tensor, Option<Tensor>), ConvertError> {
    let (offsets, values): (Vec<usize>, ArrayRef) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            (
                l.offsets().iter().map(|o| *o as usize).collect(),
                l.values().clone(),
            )
        }
        _ => {
            let l = col.as_list::<i64>();
            (
                l.offsets().iter().map(|o| *o as usize).collect(),
                l.values().clone(),
            )
        }
    };
    if values.null_count() > 0 {
        return Err(fail("the lists hold null values".into()));
    }
    let longest = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let kind = kind_of(values.data_type()).ok_or_else(|| {
        fail(format!(
            "{} values cannot become a tensor",
            values.data_type()
        ))
    })?;
    // Padded [n, longest] and a mask; rows copied one by one into place.
    let padded = Tensor::f_full([n as i64, longest as i64], spec.pad, (kind, Device::Cpu))?;
    let mut mask = vec![0u8; n * longest];
    for r in 0..n {
        let (a, b) = (offsets[r], offsets[r + 1]);
        if b > a {
            let row = values_tensor(&values, a, b - a, &[(b - a) as i64], false).map_err(fail)?;
            padded
                .get(r as i64)
                .narrow(0, 0, (b - a) as i64)
                .copy_(&row);
            mask[r * longest..r * longest + (b - a)].fill(1);
        }
    }
    let mask = Tensor::f_from_data_size(&mask, &[n as i64, longest as i64], Kind::Bool)?;
    Ok((padded, Some(mask)))
}

/// Gives each row the spec's `shape` (when it holds the row's values) and the tensor the
/// spec's `dtype`, when the spec asks for them.
fn reshape_and_cast(
    mut tensor: Tensor,
    spec: &TensorSpec,
    n: usize,
    fail: impl Fn(String) -> ConvertError,
) -> Result<Tensor, ConvertError> {
    if let Some(shape) = &spec.shape {
        let per_row: i64 = tensor.size().iter().skip(1).product();
        let want: i64 = shape.iter().product();
        if per_row != want || shape.iter().any(|d| *d <= 0) {
            return Err(fail(format!(
                "shape {shape:?} holds {want} values but each row has {per_row}"
            )));
        }
        let mut full = vec![n as i64];
        full.extend(shape);
        tensor = tensor.f_reshape(&full)?;
    }
    if let Some(dt) = spec.dtype
        && dt.kind() != tensor.kind()
    {
        tensor = tensor.f_to_kind(dt.kind())?;
    }
    Ok(tensor)
}

/// Host → device: pinned staging and a non-blocking copy on CUDA (the copy runs on the
/// current stream while this thread goes on); nothing on CPU.
///
/// The pinned staging buffers are a pool allocated once: `pin_memory` takes its block from
/// libtorch's CUDA caching host allocator (`at::getHostAllocator(kCUDA)`), which calls
/// `cudaHostAlloc` only when no cached block of the size class is free, and the
/// non-blocking copy records a CUDA event on the block, so dropping `pinned` right after
/// issuing the copy returns the block to the cache without a device-wide sync, and it is
/// handed out again only once that copy has finished. With batches of a fixed shape the pool
/// stops growing after the first `prefetch + 1` batches. (Not run here: no GPU.)
pub(super) fn to_device(t: Tensor, device: Device) -> Result<Tensor, ConvertError> {
    match device {
        Device::Cpu => Ok(t),
        d => {
            let pinned = t.f_pin_memory(d)?;
            Ok(pinned.f_to_device_(d, pinned.kind(), true, false)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, RecordBatch};
    use arrow::datatypes::Field;
    use sluice_pipeline::{Lineage, Name, Origin};

    use super::*;
    use crate::DType;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> Batch {
        let data = RecordBatch::try_from_iter(columns).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///t.parquet"),
            row_group: 0,
        };
        let n = data.num_rows() as u64;
        Batch::new(data, Lineage::new(origin, 0, n, 0))
    }

    fn specs(column: &str, dtype: Option<DType>) -> BTreeMap<String, TensorSpec> {
        let spec = TensorSpec {
            column: column.into(),
            dtype,
            shape: None,
            pad: 0.0,
            nulls: NullPolicy::Mask,
        };
        BTreeMap::from([("x".to_string(), spec)])
    }

    /// Only conversions that wrap the batch's buffers as they are count as sharing memory
    /// (the loader makes those in place); every other one copies and goes to the pool.
    #[test]
    fn only_tensors_over_the_batchs_own_values_share_its_memory() {
        let f32s = |v: Vec<Option<f32>>| Arc::new(Float32Array::from(v)) as ArrayRef;
        let list = |values: ArrayRef| -> ArrayRef {
            let item = Arc::new(Field::new("item", DataType::Float32, true));
            Arc::new(FixedSizeListArray::try_new(item, 2, values, None).unwrap())
        };
        let plain = batch(vec![("a", f32s(vec![Some(1.0), Some(2.0)]))]);
        assert!(shares_memory(&plain, &specs("a", None), Device::Cpu));
        assert!(shares_memory(
            &plain,
            &specs("a", Some(DType::F32)),
            Device::Cpu
        ));
        assert!(
            !shares_memory(&plain, &specs("a", Some(DType::F16)), Device::Cpu),
            "a cast"
        );
        assert!(
            !shares_memory(&plain, &specs("a", None), Device::Cuda(0)),
            "a device copy"
        );
        assert!(
            !shares_memory(&plain, &specs("b", None), Device::Cpu),
            "no such column"
        );
        let lists = batch(vec![("a", list(f32s(vec![Some(1.0); 4])))]);
        assert!(shares_memory(&lists, &specs("a", None), Device::Cpu));
        let null = batch(vec![("a", f32s(vec![Some(1.0), None]))]);
        assert!(
            !shares_memory(&null, &specs("a", None), Device::Cpu),
            "a mask"
        );
        let null_item = batch(vec![("a", list(f32s(vec![Some(1.0), None, None, None])))]);
        assert!(!shares_memory(&null_item, &specs("a", None), Device::Cpu));
        let bools = batch(vec![(
            "a",
            Arc::new(BooleanArray::from(vec![true])) as ArrayRef,
        )]);
        assert!(
            !shares_memory(&bools, &specs("a", None), Device::Cpu),
            "bits unpacked"
        );
    }
}
