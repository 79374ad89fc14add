//! Tests of the `image` stage: building it from its config, decoding, every op against
//! torchvision's arithmetic, and bad rows.

use super::colour::{Adjust, Colour, shift_hue};
use super::geometry::Geometry;
use super::*;
use crate::batch::{Lineage, Name, Origin};
#[cfg(feature = "image")]
use arrow::array::BinaryArray;
use arrow::array::{AsArray, FixedSizeBinaryArray};
#[cfg(feature = "image")]
use arrow::datatypes::Schema;
use arrow::datatypes::{DataType, Float32Type};

fn stage_ref() -> StageRef {
    StageRef {
        index: 0,
        kind: "image",
        location: None,
    }
}

/// A batch of `rows` raw images; `pixel(row, y, x, c)` gives the bytes.
fn batch(
    shape: [usize; 3],
    rows: usize,
    pixel: impl Fn(usize, usize, usize, usize) -> u8,
) -> Batch {
    let [h, w, ch] = shape;
    let values: Vec<Vec<u8>> = (0..rows)
        .map(|r| {
            let mut v = Vec::with_capacity(h * w * ch);
            for y in 0..h {
                for x in 0..w {
                    for c in 0..ch {
                        v.push(pixel(r, y, x, c));
                    }
                }
            }
            v
        })
        .collect();
    let arr = FixedSizeBinaryArray::try_from_iter(values.into_iter()).unwrap();
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///imgs.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, 0, rows as u64, 0))
}

fn build_stage(
    shape: [usize; 3],
    input: &Batch,
    ops: Vec<ImageOp>,
    on_error: OnError,
    format: ImageFormat,
) -> ImageStage {
    try_build(config(shape, ops, on_error, format), input)
        .unwrap()
        .0
}

/// The stage `c` builds over `input`'s schema.
fn try_build(c: ImageConfig, input: &Batch) -> Result<(ImageStage, SchemaRef)> {
    build(
        &stage_ref(),
        &c,
        &input.data.schema(),
        &crate::stage::BuildContext::default(),
    )
}

fn config(
    shape: [usize; 3],
    ops: Vec<ImageOp>,
    on_error: OnError,
    format: ImageFormat,
) -> ImageConfig {
    ImageConfig {
        column: "img".into(),
        output: None,
        format,
        shape,
        ops,
        seed: 7,
        dtype: ImageDtype::Float32,
        augment_on: AugmentOn::Host,
        on_error,
        dead_letter: None,
    }
}

/// Why a raw-image stage with these ops is refused.
fn refusal(shape: [usize; 3], input: &Batch, ops: Vec<ImageOp>) -> String {
    try_build(config(shape, ops, OnError::Fail, ImageFormat::Raw), input)
        .unwrap_err()
        .to_string()
}

/// Output row `r` as a CHW vector.
fn row(b: &Batch, r: usize) -> Vec<f32> {
    let l = b.data.column(0).as_fixed_size_list();
    l.value(r).as_primitive::<Float32Type>().values().to_vec()
}

/// Identity scaling: normalize with mean 0, std 1/255 outputs the raw 0–255 values.
fn identity(ch: usize) -> ImageOp {
    ImageOp::Normalize {
        mean: vec![0.0; ch],
        std: vec![1.0 / 255.0; ch],
    }
}

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
fn random_crop_with_padding_shifts_by_the_drawn_offsets() {
    let shape = [4, 5, 1];
    let input = batch(shape, 64, |r, y, x, _| (r + y * 10 + x + 1) as u8);
    let st = build_stage(
        shape,
        &input,
        vec![
            ImageOp::RandomCrop {
                size: [4, 5],
                padding: 2,
                padding_mode: PaddingMode::Constant,
                pad_if_needed: false,
                fill: PadFill::default(),
            },
            identity(1),
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let ids = row_ids(&input.lineage);
    let out = st.apply(input).unwrap();
    let mut offsets = std::collections::BTreeSet::new();
    for (r, id) in ids.iter().enumerate() {
        let mut rng = ChaCha8Rng::from_seed(st.key);
        rng.set_stream(*id);
        let (g, _) = st.draw(&mut rng, 4, 5);
        let (dy, dx) = (g.top as i64, g.left as i64);
        assert!((-2..=2).contains(&dy) && (-2..=2).contains(&dx));
        offsets.insert((dy, dx));
        let v = row(&out, r);
        for y in 0..4i64 {
            for x in 0..5i64 {
                let (sy, sx) = (y + dy, x + dx);
                let want = if (0..4).contains(&sy) && (0..5).contains(&sx) {
                    (r as i64 + sy * 10 + sx + 1) as f32
                } else {
                    0.0 // zero padding
                };
                assert_eq!(
                    v[(y * 5 + x) as usize],
                    want,
                    "row {r} offset ({dy},{dx}) at ({y},{x})"
                );
            }
        }
    }
    // 64 rows draw many different offsets (25 possible).
    assert!(offsets.len() >= 12, "{offsets:?}");
}

#[test]
fn one_pass_crop_equals_the_general_path() {
    // Small, and wider than the one-pass conversion's chunk (rows of 140 output pixels
    // are converted in 3 chunks, straight and mirrored).
    one_pass_matches([5, 7, 3], [4, 6], 3, 1, &[0.0]);
    one_pass_matches([3, 150, 3], [2, 140], 3, 5, &[0.0]);
    one_pass_matches([3, 150, 1], [2, 140], 3, 5, &[0.0]);
    // CIFAR: every offset of a crop with padding 4 (rows of 28–32 pixels in the image).
    one_pass_matches([32, 32, 3], [32, 32], 4, 1, &[0.0]);
    // A `fill` other than 0: one per channel, or one for all.
    one_pass_matches([5, 7, 3], [4, 6], 3, 1, &[124.0, 116.0, 104.0]);
    one_pass_matches([3, 150, 1], [2, 140], 3, 5, &[255.0]);
}

fn one_pass_matches(
    shape: [usize; 3],
    size: [usize; 2],
    padding: usize,
    step: usize,
    fill: &[f32],
) {
    let [h, w, ch] = shape;
    let input = batch(shape, 1, |_, y, x, c| (y * 31 + x * 7 + c * 3) as u8);
    let st = build_stage(
        shape,
        &input,
        vec![
            ImageOp::RandomCrop {
                size,
                padding,
                padding_mode: PaddingMode::Constant,
                pad_if_needed: false,
                fill: PadFill(fill.to_vec()),
            },
            ImageOp::Normalize {
                mean: vec![0.1, 0.2, 0.3][..ch].to_vec(),
                std: vec![0.3, 0.2, 0.1][..ch].to_vec(),
            },
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let src: Vec<u8> = (0..h * w * ch).map(|i| (i * 5 % 256) as u8).collect();
    let n = size[0] * size[1];
    let p = padding as i64;
    for top in (-p..=(h as i64 + p - size[0] as i64)).step_by(step) {
        for left in (-p..=(w as i64 + p - size[1] as i64)).step_by(step) {
            for (fh, fv) in [(false, false), (true, false), (false, true), (true, true)] {
                let g = Geometry {
                    top: top as f64,
                    left: left as f64,
                    height: size[0] as f64,
                    width: size[1] as f64,
                    flip_h: fh,
                    flip_v: fv,
                    exact: true,
                    pad: PaddingMode::Constant,
                    inner: [0, 0],
                    outer: [0, 0],
                };
                let mut fast = vec![0f32; n * ch];
                st.crop_normalize(&src, h, w, &g, &mut fast);
                let mut scratch = vec![0f32; n * ch];
                st.sample(&src, h, w, &g, &mut scratch, &mut Resampler::default());
                let slow: Vec<f32> = (0..ch)
                    .flat_map(|k| (0..n).map(move |i| (k, i)))
                    .map(|(k, i)| scratch[i * ch + k] * st.scale[k] + st.bias[k])
                    .collect();
                assert_eq!(
                    fast, slow,
                    "{shape:?} top {top} left {left} flips {fh} {fv}"
                );
                // A corner that sticks out holds the fill, normalized.
                if top < 0 && left < 0 && !fh && !fv {
                    for k in 0..ch {
                        let want = fill[k % fill.len()] * st.scale[k] + st.bias[k];
                        assert_eq!(fast[k * n], want, "channel {k}");
                    }
                }
            }
        }
    }
}

/// The four padding modes by hand, on a 3×3 image (1..9) read through windows that stick
/// out 2 pixels at the top-left and 1–2 at the bottom-right.
#[test]
fn padding_modes_read_like_torchvision() {
    let shape = [3, 3, 1];
    let input = batch(shape, 1, |_, _, _, _| 0);
    let src: Vec<u8> = (1..=9).collect();
    let read = |mode: PaddingMode, top: f64, left: f64| -> Vec<f32> {
        let st = build_stage(
            shape,
            &input,
            vec![ImageOp::RandomCrop {
                size: [3, 3],
                padding: 2,
                padding_mode: mode,
                pad_if_needed: false,
                fill: PadFill::default(),
            }],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let g = Geometry {
            top,
            left,
            height: 3.0,
            width: 3.0,
            flip_h: false,
            flip_v: false,
            exact: true,
            pad: mode,
            inner: [0, 0],
            outer: [0, 0],
        };
        let mut out = vec![f32::NAN; 9];
        st.sample(&src, 3, 3, &g, &mut out, &mut Resampler::default());
        out
    };
    use PaddingMode::*;
    // Rows and columns -2, -1, 0.
    let corner = |m| read(m, -2.0, -2.0);
    assert_eq!(corner(Constant), [0., 0., 0., 0., 0., 0., 0., 0., 1.]);
    assert_eq!(corner(Edge), [1.; 9]);
    assert_eq!(corner(Reflect), [9., 8., 7., 6., 5., 4., 3., 2., 1.]);
    assert_eq!(corner(Symmetric), [5., 4., 4., 2., 1., 1., 2., 1., 1.]);
    // Rows 1, 2, 3 and columns 2, 3, 4.
    let far = |m| read(m, 1.0, 2.0);
    assert_eq!(far(Constant), [6., 0., 0., 9., 0., 0., 0., 0., 0.]);
    assert_eq!(far(Edge), [6., 6., 6., 9., 9., 9., 9., 9., 9.]);
    assert_eq!(far(Reflect), [6., 5., 4., 9., 8., 7., 6., 5., 4.]);
    assert_eq!(far(Symmetric), [6., 6., 5., 9., 9., 8., 9., 9., 8.]);
    // Beyond one width the pattern repeats, as numpy's `pad` (checked against
    // `np.pad(np.arange(3), 7, mode)`).
    let line = |m: PaddingMode| (-7..=7).map(|i| m.index(i, 3).unwrap()).collect::<Vec<_>>();
    assert_eq!(line(Reflect), [1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1]);
    assert_eq!(
        line(Symmetric),
        [0, 0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0, 1]
    );
    assert_eq!(line(Edge), [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2]);
    assert_eq!(Reflect.index(-3, 1), Some(0));
}

/// Through the whole stage: a mode changes only the rows whose window sticks out, and
/// there it reads image pixels, never the zeros of constant padding.
#[test]
fn padding_mode_changes_only_windows_that_stick_out() {
    let shape = [4, 5, 3];
    let input = || {
        batch(shape, 200, |r, y, x, c| {
            (1 + (r * 7 + y * 20 + x * 3 + c) % 250) as u8
        })
    };
    let run = |mode| {
        let ops = vec![
            ImageOp::RandomCrop {
                size: [4, 5],
                padding: 2,
                padding_mode: mode,
                pad_if_needed: false,
                fill: PadFill::default(),
            },
            ImageOp::HorizontalFlip { p: 0.5 },
            identity(3),
        ];
        let st = build_stage(shape, &input(), ops, OnError::Fail, ImageFormat::Raw);
        let out = st.apply(input()).unwrap();
        (0..200).map(|r| row(&out, r)).collect::<Vec<_>>()
    };
    let zero = run(PaddingMode::Constant);
    let (mut inside, mut outside) = (0, 0);
    for mode in [
        PaddingMode::Edge,
        PaddingMode::Reflect,
        PaddingMode::Symmetric,
    ] {
        for (r, (a, b)) in run(mode).iter().zip(&zero).enumerate() {
            assert!(
                a.iter().all(|&v| v > 0.0),
                "{mode:?} row {r} reads a zero: {a:?}"
            );
            if b.iter().all(|&v| v > 0.0) {
                assert_eq!(a, b, "{mode:?} row {r}: window inside the image");
                inside += 1;
            } else {
                outside += 1;
            }
        }
    }
    // 1 of 5 tops and 1 of 5 lefts is inside: ~4 % of rows.
    assert!(
        inside > 0 && outside > inside,
        "{inside} inside, {outside} outside"
    );
}

#[test]
fn flips_mirror_exactly() {
    let shape = [2, 3, 1];
    let input = batch(shape, 1, |_, y, x, _| (y * 3 + x) as u8);
    let h = build_stage(
        shape,
        &input,
        vec![ImageOp::HorizontalFlip { p: 1.0 }, identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    assert_eq!(
        row(&h.apply(input.clone()).unwrap(), 0),
        vec![2.0, 1.0, 0.0, 5.0, 4.0, 3.0]
    );
    let v = build_stage(
        shape,
        &input,
        vec![ImageOp::VerticalFlip { p: 1.0 }, identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    assert_eq!(
        row(&v.apply(input.clone()).unwrap(), 0),
        vec![3.0, 4.0, 5.0, 0.0, 1.0, 2.0]
    );
    let none = build_stage(
        shape,
        &input,
        vec![ImageOp::HorizontalFlip { p: 0.0 }, identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    assert_eq!(
        row(&none.apply(input).unwrap(), 0),
        vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );
}

#[test]
fn flip_probability_is_respected() {
    let shape = [1, 2, 1];
    let input = batch(shape, 4000, |_, _, x, _| x as u8);
    let st = build_stage(
        shape,
        &input,
        vec![ImageOp::HorizontalFlip { p: 0.5 }, identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let out = st.apply(input).unwrap();
    let flipped = (0..4000).filter(|r| row(&out, *r)[0] == 1.0).count();
    assert!((1800..2200).contains(&flipped), "{flipped}");
}

/// A resized crop reads exactly its window: the same as resizing a copy of the window
/// cut out of the image (whose resize `tests/torch_parity.rs` checks against libtorch).
#[test]
fn resized_crop_resizes_exactly_its_window() {
    let (h, w) = (23usize, 31usize);
    let shape = [h, w, 3];
    let input = batch(shape, 100, |r, y, x, c| {
        ((r * 5 + y * 11 + x * 7 + c * 40) % 256) as u8
    });
    let st = build_stage(
        shape,
        &input,
        vec![
            ImageOp::RandomResizedCrop {
                size: [9, 12],
                scale: [0.1, 0.9],
                ratio: [0.5, 2.0],
            },
            ImageOp::HorizontalFlip { p: 0.5 },
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let col = input.data.column(0).as_fixed_size_binary().clone();
    let ids = row_ids(&input.lineage);
    let (mut inside, mut aa) = (0, Resampler::default());
    for (r, id) in ids.iter().enumerate() {
        let mut rng = ChaCha8Rng::from_seed(st.key);
        rng.set_stream(*id);
        let (g, _) = st.draw(&mut rng, h, w);
        let (top, left) = (g.top as usize, g.left as usize);
        let (wh, ww) = (g.height as usize, g.width as usize);
        inside += usize::from(wh < h && ww < w);
        let cut: Vec<u8> = (top..top + wh)
            .flat_map(|y| col.value(r)[(y * w + left) * 3..(y * w + left + ww) * 3].to_vec())
            .collect();
        let whole = Geometry {
            top: 0.0,
            left: 0.0,
            height: wh as f64,
            width: ww as f64,
            ..g
        };
        let (mut a, mut b) = (vec![0f32; 9 * 12 * 3], vec![0f32; 9 * 12 * 3]);
        st.sample(col.value(r), h, w, &g, &mut a, &mut aa);
        st.sample(&cut, wh, ww, &whole, &mut b, &mut aa);
        assert_eq!(a, b, "row {r}: {g:?}");
    }
    assert!(
        inside > 50,
        "{inside} of 100 windows strictly inside the image"
    );
}

#[test]
fn resized_crop_of_the_whole_image_and_upsampling() {
    let shape = [4, 4, 1];
    let input = batch(shape, 3, |_, y, x, _| (y * 4 + x) as u8);
    let whole = build_stage(
        shape,
        &input,
        vec![
            ImageOp::RandomResizedCrop {
                size: [4, 4],
                scale: [1.0, 1.0],
                ratio: [1.0, 1.0],
            },
            identity(1),
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let out = whole.apply(input.clone()).unwrap();
    assert_eq!(row(&out, 1), (0..16).map(|v| v as f32).collect::<Vec<_>>());
    // 2× bilinear upsampling of a constant image stays constant; of a ramp stays monotone.
    let up = build_stage(
        shape,
        &input,
        vec![
            ImageOp::RandomResizedCrop {
                size: [8, 8],
                scale: [1.0, 1.0],
                ratio: [1.0, 1.0],
            },
            identity(1),
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let v = row(&up.apply(input).unwrap(), 0);
    assert_eq!(v.len(), 64);
    assert_eq!(v[0], 0.0);
    assert_eq!(v[63], 15.0);
    for y in 0..8 {
        for x in 1..8 {
            assert!(v[y * 8 + x] >= v[y * 8 + x - 1]);
        }
    }
}

#[test]
fn brightness_scales_within_its_range() {
    let shape = [2, 2, 3];
    let input = batch(shape, 200, |_, _, _, _| 100);
    let st = build_stage(
        shape,
        &input,
        vec![
            ImageOp::ColorJitter {
                brightness: 0.2,
                contrast: 0.0,
                saturation: 0.0,
                hue: 0.0,
            },
            identity(3),
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let out = st.apply(input).unwrap();
    let mut seen = Vec::new();
    for r in 0..200 {
        let v = row(&out, r);
        assert!(
            v.iter().all(|x| (x - v[0]).abs() < 1e-3),
            "uniform factor per image"
        );
        assert!((80.0..=120.0).contains(&v[0]), "{}", v[0]);
        seen.push(v[0]);
    }
    seen.sort_by(f32::total_cmp);
    assert!(seen[199] - seen[0] > 30.0);
}

#[test]
#[cfg(feature = "image")] // encodes its PNGs and JPEGs with the `image` crate
fn png_and_jpeg_decode() {
    use image::ImageEncoder;
    let (h, w) = (6usize, 5usize);
    let raw: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 % 256) as u8).collect();
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&raw, w as u32, h as u32, image::ExtendedColorType::Rgb8)
        .unwrap();
    let flat = vec![128u8; h * w * 3];
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .write_image(&flat, w as u32, h as u32, image::ExtendedColorType::Rgb8)
        .unwrap();
    let arr = BinaryArray::from_iter_values([png.as_slice(), jpeg.as_slice()]);
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///x"),
        row_group: 0,
    };
    let input = Batch::new(data, Lineage::new(origin, 0, 2, 0));
    let st = build_stage(
        [h, w, 3],
        &input,
        vec![identity(3)],
        OnError::Fail,
        ImageFormat::Auto,
    );
    let out = st.apply(input).unwrap();
    let v = row(&out, 0);
    for c in 0..3 {
        for i in 0..h * w {
            assert_eq!(v[c * h * w + i], raw[i * 3 + c] as f32);
        }
    }
    assert!(row(&out, 1).iter().all(|x| (x - 128.0).abs() <= 2.0));
}

/// numpy's `pad` of an `h`×`w` grid of pixels by `py` rows and `px` columns on each side
/// (at most one image width, so one reflection), written out per mode: the reference
/// for `pad_if_needed`, which pads the padded image again.
#[cfg(feature = "image")]
fn np_pad(
    img: &[Vec<Vec<f32>>],
    py: usize,
    px: usize,
    mode: PaddingMode,
    fill: &[f32],
) -> Vec<Vec<Vec<f32>>> {
    let (h, w) = (img.len() as i64, img[0].len() as i64);
    let at = |i: i64, n: i64| -> Option<usize> {
        let j = match mode {
            _ if (0..n).contains(&i) => i,
            PaddingMode::Constant => return None,
            PaddingMode::Edge => i.clamp(0, n - 1),
            PaddingMode::Reflect if i < 0 => -i,
            PaddingMode::Reflect => 2 * (n - 1) - i,
            PaddingMode::Symmetric if i < 0 => -i - 1,
            PaddingMode::Symmetric => 2 * n - 1 - i,
        };
        Some(j as usize)
    };
    (-(py as i64)..h + py as i64)
        .map(|y| {
            (-(px as i64)..w + px as i64)
                .map(|x| match (at(y, h), at(x, w)) {
                    (Some(sy), Some(sx)) => img[sy][sx].clone(),
                    _ => fill.to_vec(),
                })
                .collect()
        })
        .collect()
}

/// PNGs of other sizes than the crop: with `pad_if_needed`, every output is a window of
/// the image padded by `padding`, then by each axis' shortfall (as torchvision does, in
/// two steps: reflecting the reflection), for every mode; the window is drawn from the
/// whole twice-padded image. Without it, a small image is an error that says so.
#[test]
#[cfg(feature = "image")] // encodes its PNGs and JPEGs with the `image` crate
fn pad_if_needed_pads_small_images_twice_like_torchvision() {
    use image::ImageEncoder;
    // (height, width): short in both axes, in one, and large enough.
    let sizes = [(3usize, 2usize), (2, 2), (5, 6), (7, 4)];
    let raws: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, (h, w))| {
            (0..h * w * 3)
                .map(|i| (1 + (i * 37 + k * 11) % 250) as u8)
                .collect()
        })
        .collect();
    let pngs: Vec<Vec<u8>> = sizes
        .iter()
        .zip(&raws)
        .map(|((h, w), raw)| {
            let mut png = Vec::new();
            image::codecs::png::PngEncoder::new(&mut png)
                .write_image(raw, *w as u32, *h as u32, image::ExtendedColorType::Rgb8)
                .unwrap();
            png
        })
        .collect();
    // Every image 40 times: 40 rows each, so 40 draws of its window.
    let rows: Vec<usize> = (0..160).map(|r| r % 4).collect();
    let arr = BinaryArray::from_iter_values(rows.iter().map(|&k| pngs[k].as_slice()));
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///small.parquet"),
        row_group: 0,
    };
    let input = Batch::new(data, Lineage::new(origin, 0, rows.len() as u64, 0));
    let (size, padding) = ([6usize, 6usize], 1usize);
    for (mode, fill) in [
        (PaddingMode::Constant, vec![9.0, 99.0, 199.0]),
        (PaddingMode::Edge, vec![0.0]),
        (PaddingMode::Reflect, vec![0.0]),
        (PaddingMode::Symmetric, vec![0.0]),
    ] {
        let crop = |pad_if_needed| ImageOp::RandomCrop {
            size,
            padding,
            padding_mode: mode,
            pad_if_needed,
            fill: PadFill(fill.clone()),
        };
        let ops = vec![crop(true), identity(3)];
        let st = build_stage([6, 6, 3], &input, ops, OnError::Fail, ImageFormat::Png);
        let out = st.apply(input.clone()).unwrap();
        let fill3: Vec<f32> = (0..3).map(|k| fill[k % fill.len()]).collect();
        let mut offsets = vec![std::collections::BTreeSet::new(); 4];
        for (r, &k) in rows.iter().enumerate() {
            let (h, w) = sizes[k];
            let img: Vec<Vec<Vec<f32>>> = (0..h)
                .map(|y| {
                    (0..w)
                        .map(|x| {
                            (0..3)
                                .map(|c| raws[k][(y * w + x) * 3 + c] as f32)
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let once = np_pad(&img, padding, padding, mode, &fill3);
            let (qy, qx) = (
                size[0].saturating_sub(h + 2 * padding),
                size[1].saturating_sub(w + 2 * padding),
            );
            let twice = np_pad(&once, qy, qx, mode, &fill3);
            let got = row(&out, r);
            let window = |top: usize, left: usize| -> Vec<f32> {
                (0..3)
                    .flat_map(|c| {
                        let twice = &twice;
                        (0..size[0]).flat_map(move |y| {
                            (0..size[1]).map(move |x| twice[top + y][left + x][c])
                        })
                    })
                    .collect()
            };
            let found = (0..=twice.len() - size[0])
                .flat_map(|t| (0..=twice[0].len() - size[1]).map(move |l| (t, l)))
                .find(|&(t, l)| window(t, l) == got);
            let Some(at) = found else {
                panic!(
                    "{mode:?}: row {r} ({h}×{w}) is no window of the twice-padded image: {got:?}"
                );
            };
            offsets[k].insert(at);
        }
        // Each image's windows come from all over its padded image.
        for (k, o) in offsets.iter().enumerate() {
            assert!(o.len() >= 4, "{mode:?}: image {k} had windows {o:?}");
        }
        // Without `pad_if_needed`, the image 3×2 does not fit.
        let st = build_stage(
            [6, 6, 3],
            &input,
            vec![crop(false), identity(3)],
            OnError::Fail,
            ImageFormat::Png,
        );
        let e = st.apply(input.clone()).unwrap_err().to_string();
        assert!(
            e.contains("the image is 2×3 (width×height), smaller than random_crop's size"),
            "{e}"
        );
        assert!(e.contains("pad_if_needed: true"), "{e}");
    }
}

#[test]
#[cfg(feature = "image")] // decodes PNG/JPEG bytes
fn bad_images_fail_with_lineage_or_are_skipped() {
    let arr = BinaryArray::from_opt_vec(vec![
        Some(&[1u8; 12][..]),
        Some(&[1u8; 11][..]),
        Some(b"\x89PNG\r\n\x1a\n garbage".as_slice()),
        None,
        Some(&[2u8; 12][..]),
    ]);
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///bad.parquet"),
        row_group: 3,
    };
    let input = Batch::new(data, Lineage::new(origin, 100, 5, 0));
    let fail = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Raw);
    let e = fail.apply(input.clone()).unwrap_err().to_string();
    assert!(e.contains("11 bytes, but shape [2, 2, 3] needs 12"), "{e}");
    assert!(
        e.contains("file:///bad.parquet row group 3, row 101"),
        "{e}"
    );
    assert!(e.contains("and 2 more"), "{e}");
    let auto = build_stage([2, 2, 3], &input, vec![], OnError::Fail, ImageFormat::Png);
    let e = auto.apply(input.slice(2, 1)).unwrap_err().to_string();
    assert!(e.contains("cannot decode the Png image"), "{e}");
    assert!(e.contains("row 102"), "{e}");
    let skip = build_stage([2, 2, 3], &input, vec![], OnError::Skip, ImageFormat::Raw);
    let out = skip.apply(input).unwrap();
    assert_eq!(out.num_rows(), 2);
    assert_eq!(out.lineage.spans()[0].first, 100);
    assert_eq!(out.lineage.spans()[1].first, 104);
    let _ = Schema::empty();
}

fn erasing(p: f64, scale: [f64; 2], ratio: [f64; 2]) -> ImageOp {
    ImageOp::RandomErasing {
        p,
        scale,
        ratio,
        value: EraseValue::Values(vec![-7.5]),
    }
}

#[test]
fn random_erasing_sets_one_drawn_box_and_leaves_the_rest() {
    // 6×8 RGB, crop (padding 1) + flip + normalize, then erase a quarter of the area
    // (12 pixels) as a square (ratio 1): √12 = 3.46, rounded to a 3×3 box.
    let shape = [6, 8, 3];
    let input = || batch(shape, 200, |r, y, x, c| (r * 7 + y * 20 + x * 3 + c) as u8);
    let ops = |erase: Option<ImageOp>| {
        let mut v = vec![
            ImageOp::RandomCrop {
                size: [6, 8],
                padding: 1,
                padding_mode: PaddingMode::Constant,
                pad_if_needed: false,
                fill: PadFill::default(),
            },
            ImageOp::HorizontalFlip { p: 0.5 },
            identity(3),
        ];
        v.extend(erase);
        v
    };
    let plain = build_stage(shape, &input(), ops(None), OnError::Fail, ImageFormat::Raw);
    let st = build_stage(
        shape,
        &input(),
        ops(Some(erasing(0.5, [0.25, 0.25], [1.0, 1.0]))),
        OnError::Fail,
        ImageFormat::Raw,
    );
    let ids = row_ids(&input().lineage);
    let (a, b) = (plain.apply(input()).unwrap(), st.apply(input()).unwrap());
    let mut erased = 0;
    let mut tops = std::collections::BTreeSet::new();
    for (r, id) in ids.iter().enumerate() {
        let mut rng = ChaCha8Rng::from_seed(st.key);
        rng.set_stream(*id);
        let _ = st.draw(&mut rng, 6, 8);
        let e = st.draw_erase(&mut rng, [6, 8]);
        let (want, got) = (row(&a, r), row(&b, r));
        let inside = |y: usize, x: usize| {
            e.is_some_and(|e| (e.top..e.top + 3).contains(&y) && (e.left..e.left + 3).contains(&x))
        };
        if let Some(e) = e {
            erased += 1;
            tops.insert((e.top, e.left));
            assert_eq!((e.height, e.width), (3, 3));
            assert_eq!(e.value, &EraseValue::Values(vec![-7.5]));
            assert!(e.top <= 3 && e.left <= 5, "{e:?}");
        }
        for k in 0..3 {
            for y in 0..6 {
                for x in 0..8 {
                    let i = k * 48 + y * 8 + x;
                    let expect = if inside(y, x) { -7.5 } else { want[i] };
                    assert_eq!(got[i], expect, "row {r} channel {k} ({y}, {x}), {e:?}");
                }
            }
        }
    }
    // p = 0.5 of 200 rows; the boxes land in many places (4 × 6 possible).
    assert!((70..=130).contains(&erased), "{erased} of 200 erased");
    assert!(tops.len() >= 12, "{tops:?}");
}

/// `value` per channel, and `random`: standard normal noise in the box (drawn from the
/// row's stream, so the same in any batch), the rest untouched.
#[test]
fn random_erasing_values_per_channel_and_random() {
    let shape = [6, 8, 3];
    let input = || batch(shape, 200, |r, y, x, c| (r * 7 + y * 20 + x * 3 + c) as u8);
    let stage = |value| {
        let erase = ImageOp::RandomErasing {
            p: 0.5,
            scale: [0.25, 0.25],
            ratio: [1.0, 1.0],
            value,
        };
        build_stage(
            shape,
            &input(),
            vec![identity(3), erase],
            OnError::Fail,
            ImageFormat::Raw,
        )
    };
    let base = build_stage(
        shape,
        &input(),
        vec![identity(3)],
        OnError::Fail,
        ImageFormat::Raw,
    )
    .apply(input())
    .unwrap();
    let per_channel = stage(EraseValue::Values(vec![1.0, 2.0, 3.0]));
    let random = stage(EraseValue::Random);
    let (a, b) = (
        per_channel.apply(input()).unwrap(),
        random.apply(input()).unwrap(),
    );
    let ids = row_ids(&input().lineage);
    let mut noise = Vec::new();
    for (r, id) in ids.iter().enumerate() {
        // Same key and ops but the value: the same boxes in both stages.
        let mut rng = ChaCha8Rng::from_seed(random.key);
        rng.set_stream(*id);
        let _ = random.draw(&mut rng, 6, 8);
        let e = random.draw_erase(&mut rng, [6, 8]);
        let (want, pc, rn) = (row(&base, r), row(&a, r), row(&b, r));
        for k in 0..3 {
            for y in 0..6 {
                for x in 0..8 {
                    let i = k * 48 + y * 8 + x;
                    let inside = e.is_some_and(|e| {
                        (e.top..e.top + 3).contains(&y) && (e.left..e.left + 3).contains(&x)
                    });
                    if inside {
                        assert_eq!(pc[i], (k + 1) as f32, "row {r} channel {k}");
                        noise.push(f64::from(rn[i]));
                    } else {
                        assert_eq!((pc[i], rn[i]), (want[i], want[i]), "row {r}");
                    }
                }
            }
        }
    }
    let n = noise.len() as f64;
    let mean = noise.iter().sum::<f64>() / n;
    let var = noise.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!(n > 2000.0, "{n} noise values");
    assert!(
        mean.abs() < 0.1 && (0.85..1.15).contains(&var),
        "mean {mean}, var {var}"
    );
    // The noise belongs to the row: the same when the rows come in other batches.
    let parts = [input().slice(0, 77), input().slice(77, 123)].map(|p| random.apply(p).unwrap());
    for r in 0..200 {
        let (p, i) = if r < 77 {
            (&parts[0], r)
        } else {
            (&parts[1], r - 77)
        };
        assert_eq!(row(p, i), row(&b, r), "row {r}");
    }
    // One value per channel, or one for all.
    let e = refusal(
        shape,
        &input(),
        vec![ImageOp::RandomErasing {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: EraseValue::Values(vec![1.0, 2.0]),
        }],
    );
    assert!(
        e.contains("`value` has 2 values; give one, or one per channel (3)"),
        "{e}"
    );
}

#[test]
fn random_erasing_that_never_fits_or_never_fires_changes_nothing() {
    let shape = [4, 4, 1];
    let input = || batch(shape, 50, |r, y, x, _| (r + y * 4 + x) as u8);
    let plain = build_stage(
        shape,
        &input(),
        vec![identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let want = plain.apply(input()).unwrap();
    // The whole area never fits (the box must be smaller than the image); p = 0 never
    // draws a box.
    for op in [
        erasing(1.0, [1.0, 1.0], [1.0, 1.0]),
        erasing(0.0, [0.1, 0.3], [0.3, 3.3]),
    ] {
        let st = build_stage(
            shape,
            &input(),
            vec![identity(1), op],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let got = st.apply(input()).unwrap();
        for r in 0..50 {
            assert_eq!(row(&got, r), row(&want, r), "row {r}");
        }
    }
}

#[test]
fn random_erasing_settings_and_place_are_checked() {
    let shape = [4, 4, 1];
    let input = batch(shape, 1, |_, _, _, _| 0);
    for (ops, expected) in [
        (
            vec![erasing(0.5, [0.02, 0.33], [0.3, 3.3]), identity(1)],
            "`normalize` is listed after `random_erasing`, but the ops apply in this order",
        ),
        (
            vec![erasing(1.5, [0.02, 0.33], [0.3, 3.3])],
            "`p` must be in [0, 1]",
        ),
        (
            vec![erasing(0.5, [0.0, 0.33], [0.3, 3.3])],
            "`scale` must satisfy",
        ),
        (
            vec![erasing(0.5, [0.02, 0.33], [3.3, 0.3])],
            "`ratio` must satisfy",
        ),
    ] {
        let e = refusal(shape, &input, ops);
        assert!(e.contains(expected), "{e}");
    }
}

#[test]
fn center_crop_cuts_the_middle_like_torchvision() {
    // 5×7 image: (y, x) holds 10 y + x + 1 (0 is left for padding), every channel.
    for ch in [1, 3] {
        let shape = [5, 7, ch];
        let input = batch(shape, 2, |_, y, x, _| (10 * y + x + 1) as u8);
        // [size], its first source row and column (torchvision: round((n - size) / 2)
        // half to even when smaller, −⌊(size − n) / 2⌋ when larger).
        for (size, top, left) in [
            ([4, 4], 0, 2),
            ([5, 7], 0, 0),
            ([6, 3], 0, 2),
            ([8, 9], -1, -1),
            ([1, 2], 2, 2),
        ] {
            let st = build_stage(
                shape,
                &input,
                vec![ImageOp::CenterCrop { size }, identity(ch)],
                OnError::Fail,
                ImageFormat::Raw,
            );
            let v = row(&st.apply(input.clone()).unwrap(), 1);
            let [oh, ow] = size;
            for k in 0..ch {
                for y in 0..oh {
                    for x in 0..ow {
                        let (sy, sx) = (y as i64 + top, x as i64 + left);
                        let want = if (0..5).contains(&sy) && (0..7).contains(&sx) {
                            (10 * sy + sx + 1) as f32
                        } else {
                            0.0
                        };
                        assert_eq!(
                            v[(k * oh + y) * ow + x],
                            want,
                            "{ch} channel(s), size {size:?} at ({y}, {x})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn resize_is_the_whole_image_resized() {
    let shape = [4, 4, 1];
    let input = batch(shape, 2, |r, y, x, _| (r * 50 + y * 4 + x) as u8);
    let run = |op: ImageOp| {
        let st = build_stage(
            shape,
            &input,
            vec![op, identity(1)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        let out = st.apply(input.clone()).unwrap();
        (row(&out, 0), row(&out, 1))
    };
    // To its own size: the image itself.
    let same = run(ImageOp::Resize { size: [4, 4] });
    assert_eq!(same.1, (0..16).map(|v| (50 + v) as f32).collect::<Vec<_>>());
    // Up: the same bilinear values as a random resized crop that must take the whole
    // (square) image.
    let whole = |size| ImageOp::RandomResizedCrop {
        size,
        scale: [1.0, 1.0],
        ratio: [1.0, 1.0],
    };
    for size in [[8, 8], [2, 2], [3, 6]] {
        let got = run(ImageOp::Resize { size });
        assert_eq!(got.0.len(), size[0] * size[1]);
        if size[0] == size[1] {
            assert_eq!(got, run(whole(size)), "{size:?}");
        }
    }
}

#[test]
fn hue_shifts_around_the_colour_wheel_like_torchvision() {
    let px = |rgb: [f32; 3], shift: f32| {
        let mut p = rgb;
        shift_hue(&mut p, shift);
        p
    };
    let close = |a: [f32; 3], b: [f32; 3]| a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-3);
    // Red → yellow (1/6) → green (1/3) → blue (2/3, or -1/3) and back to red (1).
    assert!(close(px([255.0, 0.0, 0.0], 1.0 / 6.0), [255.0, 255.0, 0.0]));
    assert!(close(px([255.0, 0.0, 0.0], 1.0 / 3.0), [0.0, 255.0, 0.0]));
    assert!(close(px([255.0, 0.0, 0.0], -1.0 / 3.0), [0.0, 0.0, 255.0]));
    assert!(close(px([255.0, 0.0, 0.0], 0.5), [0.0, 255.0, 255.0]));
    // Saturation and value are kept: (200, 100, 50) is h 1/18, s 0.75, v 200; + 1/3 is
    // h 7/18, in the green-to-cyan sixth at 1/3 of it → (50, 200, 200 (1 − 0.75 · 2/3)).
    let shifted = px([200.0, 100.0, 50.0], 1.0 / 3.0);
    assert!(close(shifted, [50.0, 200.0, 100.0]), "{shifted:?}");
    // Greys have no hue.
    assert_eq!(px([90.0, 90.0, 90.0], 0.25), [90.0, 90.0, 90.0]);
}

#[test]
fn hue_and_grayscale_draw_within_their_settings() {
    let shape = [2, 2, 3];
    let input = batch(shape, 400, |r, y, x, c| {
        ((r * 13 + y * 50 + x * 30 + c * 80) % 256) as u8
    });
    let st = build_stage(
        shape,
        &input,
        vec![
            ImageOp::ColorJitter {
                brightness: 0.0,
                contrast: 0.0,
                saturation: 0.0,
                hue: 0.1,
            },
            ImageOp::RandomGrayscale { p: 0.25 },
            identity(3),
        ],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let ids = row_ids(&input.lineage);
    let out = st.apply(input).unwrap();
    let mut greys = 0;
    for (r, id) in ids.iter().enumerate() {
        let mut rng = ChaCha8Rng::from_seed(st.key);
        rng.set_stream(*id);
        let (_, c) = st.draw(&mut rng, 2, 2);
        assert!(c.hue.abs() <= 0.1 && c.hue != 0.0, "{c:?}");
        let v = row(&out, r);
        if c.grey {
            greys += 1;
            // Every pixel grey: its three channel planes agree.
            for i in 0..4 {
                assert_eq!((v[i], v[4 + i]), (v[8 + i], v[8 + i]), "row {r} pixel {i}");
            }
        }
    }
    assert!((70..=130).contains(&greys), "{greys} of 400 grey");
}

#[test]
fn jitter_order_is_a_uniform_permutation_applied_as_drawn() {
    let jitter = |brightness, contrast, saturation, hue| ImageOp::ColorJitter {
        brightness,
        contrast,
        saturation,
        hue,
    };
    let shape = [2, 2, 3];
    let input = batch(shape, 2400, |_, _, _, _| 0);
    let ids = row_ids(&input.lineage);
    let orders = |op: ImageOp| -> Vec<[Adjust; 4]> {
        let st = build_stage(
            shape,
            &input,
            vec![op, identity(3)],
            OnError::Fail,
            ImageFormat::Raw,
        );
        ids.iter()
            .map(|id| {
                let mut rng = ChaCha8Rng::from_seed(st.key);
                rng.set_stream(*id);
                st.draw(&mut rng, 2, 2).1.order
            })
            .collect()
    };
    // All four on: each of the 24 orders ~100 times of 2400 (σ ≈ 9.8).
    let mut counts = std::collections::HashMap::new();
    for o in orders(jitter(0.4, 0.4, 0.4, 0.1)) {
        *counts.entry(o).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 24, "{counts:?}");
    assert!(
        counts.values().all(|&n| (60..=140).contains(&n)),
        "{counts:?}"
    );
    // One on: nothing to order, nothing drawn.
    assert!(
        orders(jitter(0.4, 0.0, 0.0, 0.0))
            .iter()
            .all(|o| *o == NO_COLOUR.order)
    );

    // Applied in the drawn order, by hand: pixels 100 and 200 of a grey image, brightness
    // ×2 and contrast ×0.5.
    let grey = batch([1, 2, 1], 1, |_, _, _, _| 0);
    let st = build_stage(
        [1, 2, 1],
        &grey,
        vec![jitter(0.9, 0.9, 0.0, 0.0), identity(1)],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let run = |order| {
        let mut px = [100.0f32, 200.0];
        let c = Colour {
            brightness: 2.0,
            contrast: 0.5,
            order,
            ..NO_COLOUR
        };
        st.colour(&mut px, &c);
        px
    };
    use Adjust::*;
    // Brightness first: [200, 255 (400 clamped)], mean 227.5, halved around it.
    assert_eq!(
        run([Brightness, Contrast, Saturation, Hue]),
        [213.75, 241.25]
    );
    // Contrast first: mean 150 → [125, 175], then doubled: [250, 255 (350 clamped)].
    assert_eq!(run([Hue, Contrast, Saturation, Brightness]), [250.0, 255.0]);
}

#[test]
fn colour_settings_are_checked() {
    let rgb = batch([2, 2, 3], 1, |_, _, _, _| 0);
    let grey = batch([2, 2, 1], 1, |_, _, _, _| 0);
    let jitter = |hue: f64| ImageOp::ColorJitter {
        brightness: 0.0,
        contrast: 0.0,
        saturation: 0.0,
        hue,
    };
    for (input, shape, ops, expected) in [
        (
            &rgb,
            [2, 2, 3],
            vec![jitter(0.6)],
            "`hue` must be in [0, 0.5]",
        ),
        (&grey, [2, 2, 1], vec![jitter(0.1)], "need 3 channels"),
        (
            &grey,
            [2, 2, 1],
            vec![ImageOp::RandomGrayscale { p: 0.5 }],
            "random_grayscale needs 3 channels",
        ),
        (
            &rgb,
            [2, 2, 3],
            vec![ImageOp::RandomGrayscale { p: 1.5 }],
            "`p` must be in [0, 1]",
        ),
        (
            &rgb,
            [2, 2, 3],
            vec![ImageOp::RandomGrayscale { p: 0.5 }, jitter(0.1)],
            "`color_jitter` is listed after `random_grayscale`, but the ops apply in this order",
        ),
        // Listed after `normalize`, the jitter would read as working on normalized
        // values; the stage jitters pixels, so the list must say so.
        (
            &rgb,
            [2, 2, 3],
            vec![identity(3), jitter(0.1)],
            "`color_jitter` is listed after `normalize`",
        ),
        // A second jitter would be applied once, not twice.
        (
            &rgb,
            [2, 2, 3],
            vec![jitter(0.1), jitter(0.2)],
            "`color_jitter` is listed twice",
        ),
        // Every op's problem at once, in the order of the list.
        (
            &grey,
            [2, 2, 1],
            vec![
                ImageOp::RandomGrayscale { p: 1.5 },
                jitter(0.6),
                ImageOp::HorizontalFlip { p: 2.0 },
            ],
            "4 problems in `ops`: (1) `color_jitter` is listed after `random_grayscale`, but the ops apply in this order: the geometry (a crop or resize, flips), then color_jitter, random_grayscale (on the cut window, padding included), normalize (pixels to the model's scale), random_erasing (on the normalized output); list them in that order; (2) random_grayscale: `p` must be in [0, 1], not 1.5; (3) color_jitter: `hue` must be in [0, 0.5], not 0.6; (4) flip: `p` must be in [0, 1], not 2",
        ),
    ] {
        let e = refusal(shape, input, ops);
        assert!(e.contains(expected), "{e}");
    }
}

/// `random_crop`'s `size`, `fill` and `pad_if_needed` are checked when the stage is built.
#[test]
fn crop_settings_are_checked_with_the_reason() {
    let input = batch([4, 4, 3], 1, |_, _, _, _| 0);
    let crop = |size, mode, pad_if_needed, fill: Vec<f32>| ImageOp::RandomCrop {
        size,
        padding: 1,
        padding_mode: mode,
        pad_if_needed,
        fill: PadFill(fill),
    };
    use PaddingMode::*;
    for (op, expected) in [
        (
            crop([7, 6], Constant, false, vec![0.0]),
            "size [7, 6] is larger than the padded image (6×6); set `pad_if_needed: true`",
        ),
        (
            crop([4, 4], Constant, false, vec![1.0, 2.0]),
            "`fill` has 2 values; give one, or one per channel (3)",
        ),
        (
            crop([4, 4], Constant, false, vec![256.0]),
            "`fill` is in pixel values, 0 to 255, not 256",
        ),
        (
            crop([4, 4], Reflect, false, vec![128.0]),
            "with `padding_mode: reflect` the padding repeats the image, so leave `fill` out",
        ),
    ] {
        let e = refusal([4, 4, 3], &input, vec![op]);
        assert!(e.contains(expected), "{e}");
    }
    // Larger than the padded image is fine with `pad_if_needed`.
    let st = build_stage(
        [4, 4, 3],
        &input,
        vec![crop([7, 6], Edge, true, vec![0.0])],
        OnError::Fail,
        ImageFormat::Raw,
    );
    let out = st.apply(input).unwrap();
    assert_eq!(row(&out, 0).len(), 3 * 7 * 6);
}

/// `dead_letter` holds what `on_error: skip` removes, in files.
#[test]
fn dead_letter_needs_skip_and_a_file() {
    let input = batch([2, 2, 3], 1, |_, _, _, _| 0);
    let with = |on_error, dl| {
        let mut c = config([2, 2, 3], vec![], on_error, ImageFormat::Raw);
        c.dead_letter = Some(dl);
        build(
            &stage_ref(),
            &c,
            &input.data.schema(),
            &crate::stage::BuildContext::default(),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let file = crate::config::DeadLetterConfig::File(crate::config::DeadLetterFile {
        path: "bad/".into(),
        storage: Default::default(),
    });
    let e = with(OnError::Fail, file);
    assert!(
        e.contains(
            "`dead_letter` takes the rows `on_error: skip` removes: set `on_error: skip` too"
        ),
        "{e}"
    );
    let kafka = crate::config::DeadLetterConfig::Kafka(crate::config::DeadLetterKafka {
        topic: "bad".into(),
        brokers: None,
        properties: Default::default(),
    });
    let e = with(OnError::Skip, kafka);
    assert!(e.contains("writes its dead letters to files"), "{e}");
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
