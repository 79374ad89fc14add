//! The `mixup` stage's tests.

use super::*;
use crate::batch::{Lineage, Name, Origin};
use crate::stage::Transform;
use crate::stage::augment::row_ids;
use arrow::array::{FixedSizeListArray, Float32Array, Float64Array, RecordBatch};
use arrow::datatypes::{Field, Schema};

/// `n` rows: `x` = [r, 10r] (float32 list), `y` = one-hot of `r % 3` (float32 list),
/// `s` = r (float64).
fn batch(n: usize, first: u64, epoch: u64) -> Batch {
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let x = Float32Array::from_iter_values((0..n).flat_map(|r| [r as f32, 10.0 * r as f32]));
    let y = Float32Array::from_iter_values(
        (0..n).flat_map(|r| (0..3).map(move |k| f32::from(u8::from(r % 3 == k)))),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::FixedSizeList(item.clone(), 2), false),
        Field::new("y", DataType::FixedSizeList(item.clone(), 3), false),
        Field::new("s", DataType::Float64, false),
    ]));
    let data = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(FixedSizeListArray::new(item.clone(), 2, Arc::new(x), None)),
            Arc::new(FixedSizeListArray::new(item, 3, Arc::new(y), None)),
            Arc::new(Float64Array::from_iter_values((0..n).map(|r| r as f64))),
        ],
    )
    .unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///d.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, first, n as u64, epoch))
}

fn stage(alpha: f64) -> Mixup {
    let config = MixupConfig {
        columns: vec!["x".into(), "y".into(), "s".into()],
        alpha,
        seed: 3,
        cutmix: None,
    };
    let sref = StageRef {
        index: 2,
        kind: "mixup",
        location: None,
    };
    build(&sref, &config, &batch(1, 0, 0).data.schema()).unwrap()
}

fn lambdas(s: &Mixup, ids: &[u64]) -> Vec<f64> {
    s.draws(ids).iter().map(|d| d.lambda).collect()
}

fn list(b: &Batch, c: usize, width: usize) -> Vec<f32> {
    let l = b.data.column(c).as_fixed_size_list();
    let v = l.values().slice(l.offset() * width, l.len() * width);
    v.as_primitive::<Float32Type>().values().to_vec()
}

#[test]
fn every_column_of_a_row_is_blended_with_the_mirror_row_by_one_lambda() {
    let s = stage(0.4);
    let n = 9;
    let out = s.apply(batch(n, 100, 0)).unwrap();
    let (x, y) = (list(&out, 0, 2), list(&out, 1, 3));
    let sc = out.data.column(2).as_primitive::<Float64Type>().values();
    for r in 0..n {
        let m = (n - 1 - r) as f64;
        let rf = r as f64;
        // s = λ·r + (1-λ)·m  ⇒  λ = (s - m) / (r - m); the middle row is its own mirror.
        if r == n / 2 {
            assert_eq!(sc[r], rf);
            assert_eq!(x[2 * r..2 * r + 2], [rf as f32, 10.0 * rf as f32]);
            continue;
        }
        let l = (sc[r] - m) / (rf - m);
        assert!((0.0..=1.0).contains(&l), "λ {l}");
        let expect = |a: f64, b: f64| (l * a + (1.0 - l) * b) as f32;
        assert!((x[2 * r] - expect(rf, m)).abs() < 1e-4);
        assert!((x[2 * r + 1] - expect(10.0 * rf, 10.0 * m)).abs() < 1e-3);
        for k in 0..3 {
            let hot = |row: f64| f64::from(u8::from(row as usize % 3 == k));
            assert!((y[3 * r + k] - expect(hot(rf), hot(m))).abs() < 1e-6);
        }
        // Blended labels still sum to 1.
        let sum: f32 = y[3 * r..3 * r + 3].iter().sum();
        assert!((sum - 1.0).abs() < 1e-6);
    }
}

#[test]
fn lambda_follows_the_beta_distribution_and_the_row_identity() {
    let s = stage(0.4);
    let ids: Vec<u64> = row_ids(&batch(40_000, 0, 0).lineage);
    let l = lambdas(&s, &ids);
    let n = l.len() as f64;
    let mean = l.iter().sum::<f64>() / n;
    let var = l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    // Beta(α, α): mean 1/2, variance 1 / (4 (2α + 1)) = 0.1389 for α = 0.4.
    assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    assert!((var - 1.0 / 7.2).abs() < 0.005, "variance {var}");
    // The same rows get the same λ in another batch; another epoch, other λ.
    let again = lambdas(&s, &row_ids(&batch(10, 30, 0).lineage));
    assert_eq!(again, l[30..40]);
    let later = lambdas(&s, &row_ids(&batch(10, 30, 1).lineage));
    assert_ne!(later, again);
}

#[test]
fn a_null_is_an_error_naming_the_row_and_bad_settings_are_refused() {
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let x = FixedSizeListArray::new(
        item.clone(),
        1,
        Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0)])),
        None,
    );
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(item, 1),
        true,
    )]));
    let data = RecordBatch::try_new(schema.clone(), vec![Arc::new(x)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///d.parquet"),
        row_group: 4,
    };
    let b = Batch::new(data, Lineage::new(origin, 20, 3, 0));
    let sref = StageRef {
        index: 0,
        kind: "mixup",
        location: None,
    };
    let config = |alpha: f64, col: &str| MixupConfig {
        columns: vec![col.into()],
        alpha,
        seed: 0,
        cutmix: None,
    };
    let s = build(&sref, &config(0.2, "x"), &schema).unwrap();
    let e = s.apply(b).unwrap_err().to_string();
    assert!(e.contains("column `x` holds a null"), "{e}");
    assert!(e.contains("row group 4, row 21"), "{e}");
    for (alpha, col, expected) in [
        (0.0, "x", "`alpha` must be a finite number > 0"),
        (f64::NAN, "x", "`alpha` must be a finite number > 0"),
        (0.2, "nope", "nope"),
    ] {
        let e = build(&sref, &config(alpha, col), &schema)
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{e}");
    }
}

/// `n` CHW images `[2, 4, 5]` whose value names the row and the pixel
/// (`1000 r + 100 k + 10 y + x`), and one-hot labels of `r % 3`.
fn images(n: usize) -> Batch {
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let img = Float32Array::from_iter_values((0..n).flat_map(|r| {
        (0..2).flat_map(move |k| {
            (0..4).flat_map(move |y| (0..5).map(move |x| (1000 * r + 100 * k + 10 * y + x) as f32))
        })
    }));
    let y = Float32Array::from_iter_values(
        (0..n).flat_map(|r| (0..3).map(move |k| f32::from(u8::from(r % 3 == k)))),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("img", DataType::FixedSizeList(item.clone(), 40), false),
        Field::new("y", DataType::FixedSizeList(item.clone(), 3), false),
    ]));
    let data = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(FixedSizeListArray::new(
                item.clone(),
                40,
                Arc::new(img),
                None,
            )),
            Arc::new(FixedSizeListArray::new(item, 3, Arc::new(y), None)),
        ],
    )
    .unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///i.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, 0, n as u64, 0))
}

fn cutmix_stage(p: f64, image: &str, shape: [usize; 3]) -> Result<Mixup> {
    let config = MixupConfig {
        columns: vec!["img".into(), "y".into()],
        alpha: 0.4,
        seed: 5,
        cutmix: Some(CutmixConfig {
            column: image.into(),
            shape,
            alpha: 1.0,
            p,
        }),
    };
    let sref = StageRef {
        index: 4,
        kind: "mixup",
        location: None,
    };
    build(&sref, &config, &images(1).data.schema())
}

#[test]
fn a_cutmix_box_by_hand() {
    // λ 0.75: √(1-λ) = 0.5, a 16×16 box around (5, 30) in 32×32, clipped to rows 0..13
    // and columns 22..32: 130 pixels, so the labels keep 1 - 130/1024 of the row.
    let d = cut_box([32, 32], 0.75, 5, 30);
    let cut = d.cut.unwrap();
    assert_eq!((cut.y0, cut.y1, cut.x0, cut.x1), (0, 13, 22, 32));
    assert_eq!(d.lambda, 1.0 - 130.0 / 1024.0);
    // Inside: an 8×8 box (λ 0.9375: √0.0625 = 0.25), no clipping.
    let d = cut_box([32, 32], 0.9375, 16, 16);
    let cut = d.cut.unwrap();
    assert_eq!((cut.y0, cut.y1, cut.x0, cut.x1), (12, 20, 12, 20));
    assert_eq!(d.lambda, 0.9375);
    // λ 1: an empty box, the row stays whole.
    assert_eq!(cut_box([32, 32], 1.0, 3, 3).lambda, 1.0);
}

#[test]
fn cutmix_pastes_the_mirror_rows_box_and_blends_the_labels_by_the_share_left() {
    let n = 64;
    let s = cutmix_stage(1.0, "img", [2, 4, 5]).unwrap();
    let input = images(n);
    let draws = s.draws(&row_ids(&input.lineage));
    let out = s.apply(input).unwrap();
    let (img, y) = (list(&out, 0, 40), list(&out, 1, 3));
    let mut pasted = 0;
    for (r, d) in draws.iter().enumerate() {
        let cut = d.cut.expect("p = 1: every row gets CutMix");
        let m = n - 1 - r;
        let mut inside = 0;
        for k in 0..2 {
            for yy in 0..4 {
                for x in 0..5 {
                    let boxed = (cut.y0..cut.y1).contains(&yy) && (cut.x0..cut.x1).contains(&x);
                    inside += usize::from(boxed);
                    let from = if boxed { m } else { r };
                    assert_eq!(
                        img[40 * r + 20 * k + 5 * yy + x],
                        (1000 * from + 100 * k + 10 * yy + x) as f32,
                        "row {r} channel {k} pixel ({yy}, {x}), box {cut:?}"
                    );
                }
            }
        }
        // λ is the share of the image that stayed the row's own.
        assert_eq!(d.lambda, 1.0 - (inside / 2) as f64 / 20.0);
        pasted += usize::from(inside > 0 && m != r);
        for k in 0..3 {
            let hot = |row: usize| f64::from(u8::from(row % 3 == k));
            let expect = (d.lambda * hot(r) + (1.0 - d.lambda) * hot(m)) as f32;
            assert!((y[3 * r + k] - expect).abs() < 1e-6, "row {r} label {k}");
        }
    }
    assert!(pasted > n / 2, "only {pasted} of {n} rows got a box");
}

#[test]
fn cutmix_takes_its_share_of_the_rows_and_keeps_the_blend_for_the_rest() {
    let ids: Vec<u64> = row_ids(&images(20_000).lineage);
    for (p, lo, hi) in [(0.0, 0, 0), (0.3, 5_700, 6_300), (1.0, 20_000, 20_000)] {
        let s = cutmix_stage(p, "img", [2, 4, 5]).unwrap();
        let cut = s.draws(&ids).iter().filter(|d| d.cut.is_some()).count();
        assert!((lo..=hi).contains(&cut), "p {p}: {cut} of 20000 rows");
    }
    // With p = 0 every image is blended whole, by the row's λ.
    let s = cutmix_stage(0.0, "img", [2, 4, 5]).unwrap();
    let input = images(5);
    let draws = s.draws(&row_ids(&input.lineage));
    let img = list(&s.apply(input).unwrap(), 0, 40);
    for (r, d) in draws.iter().enumerate() {
        let l = d.lambda as f32;
        for i in 0..40 {
            let (own, other) = (
                (1000 * r + i / 20 * 100 + i % 20 / 5 * 10 + i % 5) as f32,
                (1000 * (4 - r) + i / 20 * 100 + i % 20 / 5 * 10 + i % 5) as f32,
            );
            assert_eq!(
                img[40 * r + i],
                l * own + (1.0 - l) * other,
                "row {r} value {i}"
            );
        }
    }
}

#[test]
fn bad_cutmix_settings_are_refused_with_the_reason() {
    for (p, column, shape, expected) in [
        (1.5, "img", [2, 4, 5], "`cutmix.p` must be in [0, 1]"),
        (
            0.5,
            "other",
            [2, 4, 5],
            "`cutmix.column` `other` is not one of `columns` (img, y)",
        ),
        (
            0.5,
            "img",
            [3, 4, 5],
            "is 60 values per image, but column `img` holds 40",
        ),
        (0.5, "img", [2, 0, 20], "has a zero dimension"),
    ] {
        let e = cutmix_stage(p, column, shape).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    }
}
