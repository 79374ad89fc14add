//! Tests of the `image` stage's colour ops: `color_jitter` (brightness, hue, the order of
//! its adjustments), `random_grayscale`, and the colour settings it refuses.

use super::*;
use crate::stage::image::colour::{Adjust, Colour, shift_hue};

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
