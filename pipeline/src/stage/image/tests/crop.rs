//! Tests of the `image` stage's crops: `random_crop` (its drawn offsets, the one-pass
//! kernel, the padding modes, `pad_if_needed`), `center_crop`, and the crop settings it
//! refuses.

use super::*;
use crate::stage::image::geometry::Geometry;
#[cfg(feature = "image")]
use arrow::array::BinaryArray;

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
                st.crop_normalize(&src, h, w, &g, &mut fast, true);
                // The same values with plain stores (what `dtype: float16` rounds next).
                let mut cached = vec![0f32; n * ch];
                st.crop_normalize(&src, h, w, &g, &mut cached, false);
                assert_eq!(
                    fast, cached,
                    "streamed vs cached at {top},{left} flips {fh},{fv}"
                );
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
