//! Tests of the `image` stage's `random_erasing`: the drawn box, per-channel and random
//! values, boxes that never fit or never fire, and its settings and place in the ops.

use super::*;

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
