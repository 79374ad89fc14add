//! The tensor loader against real libtorch: every supported Arrow type and shape, nulls,
//! errors, prefetch and the data-stall measurement.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float16Array, Float32Array, Float64Array,
    Int8Array, Int16Array, Int32Array, Int64Array, ListArray, RecordBatch, UInt8Array,
};
use arrow::datatypes::{DataType, Field, Int64Type};
use futures::StreamExt;
use sluice_loader::{
    ConvertError, DType, LoaderConfig, NullPolicy, TensorSpec, TensorStream, batch_to_tensors,
};
use sluice_pipeline::{Batch, CpuPool, Lineage, Name, Origin, Pipeline, SourceState};
use tch::{Device, Kind, Tensor};

fn batch(columns: Vec<(&str, ArrayRef)>) -> Batch {
    let data = RecordBatch::try_from_iter(columns).unwrap();
    let n = data.num_rows() as u64;
    let origin = Origin::Object {
        url: Name::from("file:///t.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, 10, n, 0))
}

fn spec(column: &str) -> TensorSpec {
    TensorSpec {
        column: column.into(),
        dtype: None,
        shape: None,
        pad: 0.0,
        nulls: NullPolicy::Error,
    }
}

fn convert(
    b: &Batch,
    specs: Vec<(&str, TensorSpec)>,
) -> Result<BTreeMap<String, Tensor>, ConvertError> {
    let specs: BTreeMap<String, TensorSpec> =
        specs.into_iter().map(|(n, s)| (n.to_string(), s)).collect();
    batch_to_tensors(b, &specs, Device::Cpu)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    let flat = t.to_kind(Kind::Double).flatten(0, -1);
    Vec::<f64>::try_from(&flat).unwrap()
}

#[test]
fn every_primitive_type_keeps_its_kind_and_values() {
    let b = batch(vec![
        ("f32", Arc::new(Float32Array::from(vec![1.5, -2.0, 3.25]))),
        ("f64", Arc::new(Float64Array::from(vec![1e10, 0.5, -1.0]))),
        (
            "f16",
            Arc::new(Float16Array::from(vec![
                half::f16::from_f32(0.5),
                half::f16::from_f32(1.0),
                half::f16::from_f32(-2.0),
            ])),
        ),
        ("i64", Arc::new(Int64Array::from(vec![i64::MAX, -1, 0]))),
        ("i32", Arc::new(Int32Array::from(vec![7, -7, 70000]))),
        ("i16", Arc::new(Int16Array::from(vec![300, -300, 1]))),
        ("i8", Arc::new(Int8Array::from(vec![-128, 0, 127]))),
        ("u8", Arc::new(UInt8Array::from(vec![0, 200, 255]))),
        ("b", Arc::new(BooleanArray::from(vec![true, false, true]))),
    ]);
    let names = ["f32", "f64", "f16", "i64", "i32", "i16", "i8", "u8", "b"];
    let t = convert(&b, names.iter().map(|n| (*n, spec(n))).collect()).unwrap();
    let kinds = [
        Kind::Float,
        Kind::Double,
        Kind::Half,
        Kind::Int64,
        Kind::Int,
        Kind::Int16,
        Kind::Int8,
        Kind::Uint8,
        Kind::Bool,
    ];
    for (n, k) in names.iter().zip(kinds) {
        assert_eq!(t[*n].kind(), k, "{n}");
        assert_eq!(t[*n].size(), vec![3], "{n}");
    }
    assert_eq!(f64s(&t["f32"]), vec![1.5, -2.0, 3.25]);
    assert_eq!(f64s(&t["f64"]), vec![1e10, 0.5, -1.0]);
    assert_eq!(f64s(&t["f16"]), vec![0.5, 1.0, -2.0]);
    assert_eq!(
        Vec::<i64>::try_from(&t["i64"]).unwrap(),
        vec![i64::MAX, -1, 0]
    );
    assert_eq!(f64s(&t["i32"]), vec![7.0, -7.0, 70000.0]);
    assert_eq!(f64s(&t["i16"]), vec![300.0, -300.0, 1.0]);
    assert_eq!(f64s(&t["i8"]), vec![-128.0, 0.0, 127.0]);
    assert_eq!(f64s(&t["u8"]), vec![0.0, 200.0, 255.0]);
    assert_eq!(f64s(&t["b"]), vec![1.0, 0.0, 1.0]);
}

#[test]
fn fixed_size_lists_reshape_cast_and_respect_slices() {
    let values = Float32Array::from_iter_values((0..24).map(|v| v as f32));
    let list = FixedSizeListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Float32, false)),
        6,
        Arc::new(values),
        None,
    )
    .unwrap();
    let labels = UInt8Array::from(vec![1, 2, 3, 4]);
    let b = batch(vec![("x", Arc::new(list)), ("y", Arc::new(labels))]);
    // A slice of the batch: rows 1..3 (offsets into the shared buffers).
    let b = b.slice(1, 2);
    let t = convert(
        &b,
        vec![
            (
                "x",
                TensorSpec {
                    shape: Some(vec![2, 3]),
                    dtype: Some(DType::F64),
                    ..spec("x")
                },
            ),
            (
                "y",
                TensorSpec {
                    dtype: Some(DType::I64),
                    ..spec("y")
                },
            ),
        ],
    )
    .unwrap();
    assert_eq!(t["x"].size(), vec![2, 2, 3]);
    assert_eq!(t["x"].kind(), Kind::Double);
    assert_eq!(f64s(&t["x"]), (6..18).map(|v| v as f64).collect::<Vec<_>>());
    assert_eq!(t["y"].kind(), Kind::Int64);
    assert_eq!(Vec::<i64>::try_from(&t["y"]).unwrap(), vec![2, 3]);
    let err = convert(
        &b,
        vec![(
            "x",
            TensorSpec {
                shape: Some(vec![4, 2]),
                ..spec("x")
            },
        )],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("shape [4, 2] holds 8 values but each row has 6"),
        "{err}"
    );
}

#[test]
fn variable_length_lists_are_padded_with_a_mask() {
    let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(1), Some(2), Some(3)]),
        Some(vec![]),
        Some(vec![Some(4)]),
    ]);
    let b = batch(vec![("tok", Arc::new(list))]);
    let t = convert(
        &b,
        vec![(
            "tok",
            TensorSpec {
                pad: -1.0,
                ..spec("tok")
            },
        )],
    )
    .unwrap();
    assert_eq!(t["tok"].size(), vec![3, 3]);
    assert_eq!(
        Vec::<i64>::try_from(&t["tok"].flatten(0, -1)).unwrap(),
        vec![1, 2, 3, -1, -1, -1, 4, -1, -1]
    );
    assert_eq!(t["tok_mask"].kind(), Kind::Bool);
    assert_eq!(
        f64s(&t["tok_mask"]),
        vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    );
}

#[test]
fn nulls_stop_with_the_row_or_become_a_mask_and_bad_columns_are_named() {
    let b = batch(vec![(
        "v",
        Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0)])),
    )]);
    let err = convert(&b, vec![("v", spec("v"))]).unwrap_err().to_string();
    assert!(err.contains("row 1 is null"), "{err}");
    assert!(
        err.contains("file:///t.parquet row group 0, row 11 (epoch 0)"),
        "{err}"
    );
    assert!(err.contains("nulls: mask"), "{err}");
    let t = convert(
        &b,
        vec![(
            "v",
            TensorSpec {
                nulls: NullPolicy::Mask,
                ..spec("v")
            },
        )],
    )
    .unwrap();
    assert_eq!(f64s(&t["v_valid"]), vec![1.0, 0.0, 1.0]);
    assert_eq!(f64s(&t["v"]), vec![1.0, 0.0, 3.0]);
    // A null list row holds values under its null (noise added to it, say): zeros all the same.
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let values = Float32Array::from(vec![1.0, 2.0, 7.5, -7.5, 5.0, 6.0]);
    let nulls = arrow::buffer::NullBuffer::from(vec![true, false, true]);
    let list = FixedSizeListArray::try_new(item, 2, Arc::new(values), Some(nulls)).unwrap();
    let t = convert(
        &batch(vec![("l", Arc::new(list))]),
        vec![(
            "l",
            TensorSpec {
                nulls: NullPolicy::Mask,
                ..spec("l")
            },
        )],
    )
    .unwrap();
    assert_eq!(f64s(&t["l"]), vec![1.0, 2.0, 0.0, 0.0, 5.0, 6.0]);
    assert_eq!(f64s(&t["l_valid"]), vec![1.0, 0.0, 1.0]);
    let err = convert(&b, vec![("w", spec("nope"))])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tensor `w` from column `nope`: no such column; the batch has: v"),
        "{err}"
    );
    let s = batch(vec![(
        "s",
        Arc::new(arrow::array::StringArray::from(vec!["a"])),
    )]);
    let err = convert(&s, vec![("s", spec("s"))]).unwrap_err().to_string();
    assert!(
        err.contains("a Utf8 column cannot become a tensor"),
        "{err}"
    );
}

fn digits_loader(prefetch: usize) -> LoaderConfig {
    LoaderConfig {
        device: "cpu".into(),
        prefetch,
        tensors: [
            (
                "x".to_string(),
                TensorSpec {
                    dtype: Some(DType::F32),
                    shape: Some(vec![1, 8, 8]),
                    ..spec("pixels")
                },
            ),
            ("y".to_string(), spec("label")),
        ]
        .into_iter()
        .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digits_become_tensors_with_states_to_resume_from() {
    let yaml = format!(
        "source: {{type: parquet, path: '{}/../data/digits/train.parquet', batch_rows: 100}}\nstages:\n- {{type: batch, size: 64}}\nruntime: {{threads: 2}}\n",
        env!("CARGO_MANIFEST_DIR")
    );
    let prepared = Pipeline::from_yaml(&yaml).unwrap().prepare().await.unwrap();
    let pool = prepared.pool().clone();
    let mut s = TensorStream::new(prepared.stream(), pool, &digits_loader(2)).unwrap();
    let mut rows = 0;
    let mut last: Option<SourceState> = None;
    while let Some(b) = s.next().await {
        let b = b.unwrap();
        assert_eq!(b.get("x").unwrap().size(), vec![b.rows as i64, 1, 8, 8]);
        assert_eq!(b.get("y").unwrap().kind(), Kind::Int64);
        rows += b.rows;
        last = Some(b.state.clone());
    }
    assert_eq!(rows, 1437);
    assert!(last.unwrap().parquet.is_some());
    assert_eq!(
        s.stats().batches.load(std::sync::atomic::Ordering::Relaxed),
        23
    );
}

/// A consumer that works `step` per batch against a source that needs `produce` per batch.
async fn stall(step: Duration, produce: Duration, batches: usize) -> f64 {
    let rows: Vec<(Result<Batch, ConvertError>, SourceState)> = (0..batches)
        .map(|i| {
            let b = batch(vec![(
                "label",
                Arc::new(Int64Array::from_iter_values(i as i64 * 8..i as i64 * 8 + 8)) as ArrayRef,
            )]);
            (Ok(b), SourceState::default())
        })
        .collect();
    // The source: one batch per `produce` (a slow pipeline, or a fast one when tiny).
    let source = futures::stream::iter(rows).then(move |item| async move {
        tokio::time::sleep(produce).await;
        item
    });
    let config = LoaderConfig {
        device: "cpu".into(),
        prefetch: 4,
        tensors: [("y".to_string(), spec("label"))].into_iter().collect(),
    };
    let mut s = TensorStream::from_stream(source, CpuPool::new(Some(1)).unwrap(), &config).unwrap();
    let mut n = 0;
    while let Some(b) = s.next().await {
        b.unwrap();
        n += 1;
        // The training step (a stand-in for forward/backward on the device).
        tokio::time::sleep(step).await;
    }
    assert_eq!(n, batches);
    s.stats().stall_fraction()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_hides_a_fast_pipeline_and_reports_a_slow_one() {
    // Fast pipeline (1 ms per batch) under a 20 ms step: the next batch is always ready.
    let fast = stall(Duration::from_millis(20), Duration::from_millis(1), 40).await;
    assert!(
        fast <= 0.01,
        "stall {fast:.4} of the step time with a fast pipeline"
    );
    // Slow pipeline (20 ms per batch) under a 5 ms step: the consumer waits ~15 of every 20 ms.
    let slow = stall(Duration::from_millis(5), Duration::from_millis(20), 30).await;
    assert!(
        (0.6..0.9).contains(&slow),
        "stall {slow:.3}, expected about 0.75"
    );
}

/// On the CPU, numbers and fixed-size lists of the requested dtype share the Arrow memory
/// (pointer equality), the tensor — and any view or shallow clone of it — keeps that memory
/// alive after the batch is gone, and the memory is released when the last tensor goes.
/// Anything needing conversion is a copy.
#[test]
fn zero_copy_shares_the_arrow_buffer_and_keeps_it_alive() {
    let values = Float32Array::from_iter_values((0..12).map(|v| v as f32));
    let buffer = values.values().inner().clone();
    let ptr = buffer.as_ptr() as usize;
    let list = FixedSizeListArray::try_new(
        Arc::new(Field::new_list_field(DataType::Float32, false)),
        4,
        Arc::new(Float32Array::from_iter_values(
            (0..48).map(|v| v as f32 * 2.0),
        )),
        None,
    )
    .unwrap();
    let list_ptr = list.values().to_data().buffers()[0].as_ptr() as usize;
    let b = batch(vec![("v", Arc::new(values)), ("m", Arc::new(list))]);
    let before = buffer.strong_count();
    let mut t = convert(
        &b,
        vec![
            ("v", spec("v")),
            (
                "m",
                TensorSpec {
                    shape: Some(vec![2, 2]),
                    ..spec("m")
                },
            ),
            (
                "cast",
                TensorSpec {
                    dtype: Some(DType::F64),
                    ..spec("v")
                },
            ),
        ],
    )
    .unwrap();
    assert_eq!(t["v"].data_ptr() as usize, ptr, "numbers: no copy");
    assert_eq!(
        t["m"].data_ptr() as usize,
        list_ptr,
        "fixed-size lists: no copy"
    );
    assert_eq!(t["m"].size(), vec![12, 2, 2]);
    assert_ne!(t["cast"].data_ptr() as usize, ptr, "a cast copies");
    assert_eq!(
        buffer.strong_count(),
        before + 1,
        "the tensor holds the buffer"
    );
    drop(b);
    let view = t.remove("v").unwrap().shallow_clone();
    drop(t);
    assert_eq!(
        f64s(&view),
        (0..12).map(|v| v as f64).collect::<Vec<_>>(),
        "valid after the batch is dropped"
    );
    assert_eq!(view.data_ptr() as usize, ptr);
    drop(view);
    assert_eq!(buffer.strong_count(), 1, "released with the last tensor");
}

#[test]
fn devices_parse_and_a_bad_one_says_what_is_accepted() {
    use sluice_loader::parse_device;
    assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
    assert_eq!(parse_device("cuda").unwrap(), Device::Cuda(0));
    assert_eq!(parse_device("cuda:1").unwrap(), Device::Cuda(1));
    // `auto` is CUDA only where a device is present (never on this CPU-only machine's CI).
    assert_eq!(parse_device("auto").unwrap(), Device::cuda_if_available());
    for bad in ["gpu", "cuda:x", "cuda:", ""] {
        let err = parse_device(bad).unwrap_err().to_string();
        assert!(
            err.contains(&format!("device `{bad}`: use auto, cpu, cuda or cuda:N")),
            "{bad}: {err}"
        );
    }
}

/// The `x` tensors of every batch of `yaml`'s pipeline, converted on the CPU.
async fn image_tensors(yaml: &str, x: TensorSpec) -> Vec<Tensor> {
    let prepared = Pipeline::from_yaml(yaml).unwrap().prepare().await.unwrap();
    let specs: BTreeMap<String, TensorSpec> = [("x".to_string(), x)].into();
    let loader = LoaderConfig {
        device: "cpu".into(),
        prefetch: 1,
        tensors: specs.clone(),
    };
    loader.check(prepared.schema()).unwrap();
    let mut stream = prepared.stream();
    let mut out = Vec::new();
    while let Some(b) = stream.next().await {
        let t = batch_to_tensors(&b.unwrap(), &specs, Device::Cpu).unwrap();
        out.push(t["x"].shallow_clone());
    }
    out
}

/// A pipeline over `images` with one `image` stage (`stage`: its settings after `column`).
fn image_pipeline(images: &str, stage: &str) -> String {
    format!(
        "source: {{type: parquet, path: '{images}', batch_rows: 50, epochs: 2}}\nstages:\n- {{type: image, column: pixels, output: image, seed: 3, {stage}}}\n- {{type: batch, size: 64}}\nruntime: {{threads: 2}}\n"
    )
}

/// 3-channel 5×7 images of random bytes, in a Parquet file under `dir`.
fn rgb_images(dir: &std::path::Path) -> String {
    use arrow::array::FixedSizeBinaryArray;
    let mut state = 0x9e37_79b9_u32;
    let rows: Vec<Vec<u8>> = (0..150)
        .map(|_| {
            (0..5 * 7 * 3)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                })
                .collect()
        })
        .collect();
    let pixels = FixedSizeBinaryArray::try_from_iter(rows.iter()).unwrap();
    let data = RecordBatch::try_from_iter([("pixels", Arc::new(pixels) as ArrayRef)]).unwrap();
    let path = dir.join("rgb.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, data.schema(), None).unwrap();
    w.write(&data).unwrap();
    w.close().unwrap();
    path.display().to_string()
}

/// `augment_on: device` gives, bit for bit, what the `image` stage gives on the host: the same
/// draws (crops, flips) and the same arithmetic (fill, conversion, normalize), for every
/// padding mode, `pad_if_needed`, a centre crop larger than the image, `uint8` and `float16`
/// output and 1 or 3 channels — here with the device ops run on CPU tensors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_augmentation_equals_the_host_image_stage_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let digits = format!(
        "{}/../data/digits/train.parquet",
        env!("CARGO_MANIFEST_DIR")
    );
    let rgb = rgb_images(dir.path());
    let grey = "shape: [8, 8, 1]";
    let cases: Vec<(&str, String, [i64; 3])> = vec![
        (&digits, format!("{grey}, ops: [{{random_crop: {{size: [8, 8], padding: 2, fill: 9}}}}, {{horizontal_flip: {{p: 0.5}}}}, {{vertical_flip: {{p: 0.3}}}}, {{normalize: {{mean: [0.0191], std: [0.0236]}}}}]"), [1, 8, 8]),
        (&digits, format!("{grey}, ops: [{{random_crop: {{size: [6, 7], padding: 3, padding_mode: reflect}}}}, {{horizontal_flip: {{p: 0.5}}}}]"), [1, 6, 7]),
        (&digits, format!("{grey}, ops: [{{random_crop: {{size: [12, 11], padding: 1, pad_if_needed: true, padding_mode: symmetric}}}}]"), [1, 12, 11]),
        (&digits, format!("{grey}, ops: [{{center_crop: {{size: [10, 5]}}}}, {{normalize: {{mean: [0.02], std: [0.03]}}}}]"), [1, 10, 5]),
        (&digits, format!("{grey}, dtype: uint8, ops: [{{random_crop: {{size: [8, 8], padding: 2, padding_mode: edge}}}}, {{horizontal_flip: {{p: 0.5}}}}]"), [1, 8, 8]),
        (&rgb, "shape: [5, 7, 3], ops: [{random_crop: {size: [5, 7], padding: 2, fill: [10, 200.5, 30]}}, {horizontal_flip: {p: 0.5}}, {normalize: {mean: [0.4, 0.5, 0.6], std: [0.2, 0.25, 0.3]}}]".into(), [3, 5, 7]),
        (&rgb, "shape: [5, 7, 3], dtype: uint8, ops: [{random_crop: {size: [6, 6], padding: 1, fill: [10, 200.5, 30]}}, {vertical_flip: {p: 0.5}}]".into(), [3, 6, 6]),
        (&digits, format!("{grey}, dtype: float16, ops: [{{random_crop: {{size: [8, 8], padding: 2, fill: 9}}}}, {{horizontal_flip: {{p: 0.5}}}}, {{normalize: {{mean: [0.0191], std: [0.0236]}}}}]"), [1, 8, 8]),
        (&rgb, "shape: [5, 7, 3], dtype: float16, ops: [{random_crop: {size: [5, 7], padding: 2, fill: [10, 200.5, 30]}}, {horizontal_flip: {p: 0.5}}, {normalize: {mean: [0.4, 0.5, 0.6], std: [0.2, 0.25, 0.3]}}]".into(), [3, 5, 7]),
    ];
    for (images, stage, dims) in cases {
        let host = image_tensors(
            &image_pipeline(images, &stage),
            TensorSpec {
                shape: Some(dims.to_vec()),
                ..spec("image")
            },
        )
        .await;
        let device = image_tensors(
            &image_pipeline(images, &format!("{stage}, augment_on: device")),
            spec("image"),
        )
        .await;
        assert_eq!(host.len(), device.len(), "{stage}");
        for (h, d) in host.iter().zip(&device) {
            assert_eq!(d.size()[1..], dims, "{stage}");
            assert_eq!(h.kind(), d.kind(), "{stage}");
            assert!(
                h.equal(d),
                "{stage}: the device ops differ from the host stage"
            );
        }
        // Not vacuous: the rows of a batch were cut differently (the images differ).
        let first = &device[0];
        assert!(!first.get(0).equal(&first.get(1)), "{stage}");
    }
}

/// `augment_on: device` refuses ops it cannot run on the device, and the loader names the
/// index column when a later stage dropped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_augmentation_refuses_what_it_cannot_do() {
    let digits = format!(
        "{}/../data/digits/train.parquet",
        env!("CARGO_MANIFEST_DIR")
    );
    let yaml = image_pipeline(
        &digits,
        "shape: [8, 8, 1], augment_on: device, ops: [{resize: {size: [4, 4]}}]",
    );
    let err = Pipeline::from_yaml(&yaml)
        .unwrap()
        .prepare()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`resize` runs only on the host"), "{err}");
    let yaml = format!(
        "source: {{type: parquet, path: '{digits}'}}\nstages:\n- {{type: image, column: pixels, output: image, shape: [8, 8, 1], augment_on: device, ops: [{{horizontal_flip: {{p: 0.5}}}}]}}\n- {{type: select, columns: [image, label]}}\n"
    );
    let prepared = Pipeline::from_yaml(&yaml).unwrap().prepare().await.unwrap();
    let loader = LoaderConfig {
        device: "cpu".into(),
        prefetch: 1,
        tensors: [("x".to_string(), spec("image"))].into(),
    };
    let err = loader.check(prepared.schema()).unwrap_err().to_string();
    assert!(
        err.contains("`image_index`") && err.contains("keep it through the later stages"),
        "{err}"
    );
    let mut stream = prepared.stream();
    let b = stream.next().await.unwrap().unwrap();
    let err = batch_to_tensors(&b, &loader.tensors, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`image_index`") && err.contains("is missing"),
        "{err}"
    );
}
