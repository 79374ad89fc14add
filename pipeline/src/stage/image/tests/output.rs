//! Tests of the `image` stage's output: CHW floats, normalized; `dtype: uint8` (the pixels
//! of the float output, and refusing float ops); `dtype: float16` (the float output
//! rounded); and the index column of `augment_on: device`.

use super::*;
use arrow::datatypes::DataType;

#[test]
fn output_is_chw_and_normalized() {
    let input = batch([2, 2, 3], 1, |_, y, x, c| (c * 100 + y * 2 + x) as u8);
    let st = build_stage(
        [2, 2, 3],
        &input,
        vec![ImageOp::Normalize {
            mean: vec![0.5, 0.5, 0.5],
            std: vec![0.25, 0.5, 1.0],
        }],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let out = st.apply(input).unwrap();
    let v = row(&out, 0);
    // Channel planes in order, each row-major; (p/255 - 0.5) / std.
    let expect: Vec<f32> = (0..3)
        .flat_map(|c| (0..4).map(move |i| (c, i)))
        .map(|(c, i)| {
            let p = (c * 100 + i) as f32;
            (p / 255.0 - 0.5) / [0.25, 0.5, 1.0][c]
        })
        .collect();
    for (a, b) in v.iter().zip(&expect) {
        assert!((a - b).abs() < 1e-5, "{v:?} vs {expect:?}");
    }
    assert_eq!(
        out.data.schema().field(0).data_type(),
        &DataType::FixedSizeList(
            Arc::new(Field::new_list_field(DataType::Float32, false)),
            12
        )
    );
}

#[test]
fn uint8_output_normalized_afterwards_equals_the_float_output() {
    let shape = [8, 8, 3];
    let input = batch(shape, 6, |r, y, x, c| {
        (r * 37 + y * 11 + x * 5 + c * 80) as u8
    });
    let (mean, std) = (vec![0.4914, 0.4822, 0.4465], vec![0.2470, 0.2435, 0.2616]);
    let geometry = vec![
        ImageOp::RandomCrop {
            size: [8, 8],
            padding: 2,
            padding_mode: PaddingMode::Constant,
            pad_if_needed: false,
            fill: PadFill::default(),
        },
        ImageOp::HorizontalFlip { p: 0.5 },
    ];
    let mut ops = geometry.clone();
    ops.push(ImageOp::Normalize {
        mean: mean.clone(),
        std: std.clone(),
    });
    let floats = build_stage(shape, &input, ops, OnError::Fail, ImageFormat::Raw)
        .apply(input.clone())
        .unwrap();
    let mut c = config(shape, geometry, OnError::Fail, ImageFormat::Raw);
    c.dtype = ImageDtype::Uint8;
    let (st, schema) = try_build(c, &input).unwrap();
    let bytes = st.apply(input).unwrap();
    assert_eq!(
        schema.field(0).data_type(),
        &DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::UInt8, false)), 192)
    );
    for r in 0..6 {
        let b = bytes.data.column(0).as_fixed_size_list().value(r);
        let b = b.as_primitive::<arrow::datatypes::UInt8Type>().values();
        let f = row(&floats, r);
        // What sluice.torch.normalize computes on the device: the same f32 scale and bias.
        for (i, (p, want)) in b.iter().zip(&f).enumerate() {
            let k = i / 64;
            let scale = (1.0 / (255.0 * std[k])) as f32;
            let bias = (-mean[k] / std[k]) as f32;
            assert_eq!(
                (*p as f32 * scale + bias).to_bits(),
                want.to_bits(),
                "row {r} value {i}"
            );
        }
    }
}

/// The `uint8` crop (its own kernel since it stopped going through floats) gives the pixels of
/// the float output (0–1 without `normalize`) for 1 and 3 channels, padding included.
#[test]
fn uint8_output_is_the_float_output_in_pixels_for_one_and_three_channels() {
    for ch in [1, 3] {
        let shape = [9, 7, ch];
        let input = batch(shape, 8, |r, y, x, c| {
            (r * 31 + y * 13 + x * 7 + c * 60) as u8
        });
        let ops = vec![
            ImageOp::RandomCrop {
                size: [9, 7],
                padding: 3,
                padding_mode: PaddingMode::Constant,
                pad_if_needed: false,
                fill: PadFill::default(),
            },
            ImageOp::HorizontalFlip { p: 0.5 },
            ImageOp::VerticalFlip { p: 0.5 },
        ];
        let floats = build_stage(shape, &input, ops.clone(), OnError::Fail, ImageFormat::Raw)
            .apply(input.clone())
            .unwrap();
        let mut c = config(shape, ops, OnError::Fail, ImageFormat::Raw);
        c.dtype = ImageDtype::Uint8;
        let (st, _) = try_build(c, &input).unwrap();
        let bytes = st.apply(input).unwrap();
        for r in 0..8 {
            let b = bytes.data.column(0).as_fixed_size_list().value(r);
            let b = b
                .as_primitive::<arrow::datatypes::UInt8Type>()
                .values()
                .to_vec();
            let want: Vec<u8> = row(&floats, r)
                .iter()
                .map(|v| (v * 255.0).round() as u8)
                .collect();
            assert_eq!(b, want, "{ch} channels, row {r}");
        }
    }
}

/// `dtype: float16` is the float32 output rounded to nearest-even, bit for bit (checked
/// against `half`'s software rounding, so the F16C path is checked where the CPU has it): on
/// the RGB kernel's path (32 pixels a row) with random erasing drawn after the crop, on the
/// one-channel path, and for an image larger than the staging copy.
#[test]
fn float16_output_is_the_float32_output_rounded() {
    let crop = |h: usize, w: usize| ImageOp::RandomCrop {
        size: [h, w],
        padding: 4,
        padding_mode: PaddingMode::Constant,
        pad_if_needed: false,
        fill: PadFill::default(),
    };
    let cases = [
        (
            [32, 32, 3],
            vec![
                crop(32, 32),
                ImageOp::HorizontalFlip { p: 0.5 },
                ImageOp::Normalize {
                    mean: vec![0.4914, 0.4822, 0.4465],
                    std: vec![0.2470, 0.2435, 0.2616],
                },
                ImageOp::RandomErasing {
                    p: 0.5,
                    scale: [0.1, 0.3],
                    ratio: [0.5, 2.0],
                    value: EraseValue::Values(vec![0.1234567]),
                },
            ],
        ),
        (
            [9, 7, 1],
            vec![crop(9, 7), ImageOp::VerticalFlip { p: 0.5 }],
        ),
        // Larger than the staging copy (73.5 KiB of float16): written straight to the batch.
        (
            [112, 112, 3],
            vec![crop(112, 112), ImageOp::HorizontalFlip { p: 0.5 }],
        ),
    ];
    for (shape, ops) in cases {
        let input = batch(shape, 8, |r, y, x, c| {
            (r * 31 + y * 13 + x * 7 + c * 60) as u8
        });
        let floats = build_stage(shape, &input, ops.clone(), OnError::Fail, ImageFormat::Raw)
            .apply(input.clone())
            .unwrap();
        let mut c = config(shape, ops, OnError::Fail, ImageFormat::Raw);
        c.dtype = ImageDtype::Float16;
        let (st, schema) = try_build(c, &input).unwrap();
        let halves = st.apply(input).unwrap();
        let k = shape[0] * shape[1] * shape[2];
        assert_eq!(
            schema.field(0).data_type(),
            &DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Float16, false)),
                k as i32
            )
        );
        assert_eq!(halves.data.schema(), schema);
        for r in 0..8 {
            let got = halves.data.column(0).as_fixed_size_list().value(r);
            let got: Vec<u16> = got
                .as_primitive::<arrow::datatypes::Float16Type>()
                .values()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let want: Vec<u16> = row(&floats, r)
                .iter()
                .map(|v| half::f16::from_f32_const(*v).to_bits())
                .collect();
            assert_eq!(got, want, "{shape:?}, row {r}");
        }
        // Not vacuous on the first case: erased rows (rounded after erasing) and rows that
        // take the one-pass kernel.
        let erased = (0..8)
            .filter(|r| row(&floats, *r).contains(&0.1234567))
            .count();
        assert!(shape != [32, 32, 3] || (1..8).contains(&erased), "{erased}");
    }
}

#[test]
fn uint8_output_refuses_float_ops() {
    let input = batch([4, 4, 1], 1, |_, _, _, _| 0);
    let mut c = config(
        [4, 4, 1],
        vec![identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    c.dtype = ImageDtype::Uint8;
    let e = try_build(c, &input).unwrap_err().to_string();
    assert!(
        e.contains("`normalize` works on normalized floats")
            && e.contains("sluice.torch.normalize"),
        "{e}"
    );
}

#[test]
fn augment_on_device_refuses_an_index_column_name_that_is_taken() {
    let raw = batch([4, 4, 1], 1, |_, _, _, _| 0);
    // The input column itself is named like the index column `output: x` would add.
    let data = RecordBatch::try_from_iter([("x_index", raw.data.column(0).clone())]).unwrap();
    let input = Batch::new(data, raw.lineage.clone());
    let mut c = config([4, 4, 1], vec![], OnError::Fail, ImageFormat::Raw);
    c.column = "x_index".into();
    c.output = Some("x".into());
    c.augment_on = AugmentOn::Device;
    let e = try_build(c.clone(), &input).unwrap_err().to_string();
    assert!(
        e.contains("adds the column `x_index`") && e.contains("already exists"),
        "{e}"
    );
    c.output = Some("y".into());
    let (_, schema) = try_build(c, &input).unwrap();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["x_index", "y", "y_index"]);
}
