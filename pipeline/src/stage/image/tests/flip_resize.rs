//! Tests of the `image` stage's flips and resizes: `horizontal_flip` and `vertical_flip`,
//! `random_resized_crop` and `resize`.

use super::*;
use crate::stage::image::geometry::Geometry;

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
