use super::*;
use crate::batch::Name;
use crate::stage::Transform;
use arrow::array::Float32Array;
use arrow::datatypes::{Field, Schema};

fn batch(n: usize, first: u64, epoch: u64) -> Batch {
    let field = Arc::new(Field::new("item", DataType::Float32, true));
    let values = Float32Array::from_iter_values((0..n * 4).map(|v| v as f32));
    let x = FixedSizeListArray::try_new(field.clone(), 4, Arc::new(values), None).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new(
        "x",
        DataType::FixedSizeList(field, 4),
        true,
    )]));
    let data = RecordBatch::try_new(schema, vec![Arc::new(x)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///d.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, first, n as u64, epoch))
}

fn stage(noise: Noise) -> Augment {
    Augment {
        stage: StageRef {
            index: 0,
            kind: "gaussian_noise",
            location: None,
        },
        noise,
        columns: vec![(0, column_key(7, 0, "x"))],
        schema: batch(1, 0, 0).data.schema(),
        pre: Vec::new(),
    }
}

fn flat(b: &Batch) -> Vec<f32> {
    let l = b.data.column(0).as_fixed_size_list();
    let v = l.values().slice(l.offset() * 4, l.len() * 4);
    v.as_primitive::<Float32Type>().values().to_vec()
}

#[test]
fn noise_depends_on_the_row_not_on_batching() {
    for draws in [Draws::ChaCha8, Draws::SplitMix64] {
        noise_depends_on_the_row_not_on_batching_with(draws);
    }
}

fn noise_depends_on_the_row_not_on_batching_with(draws: Draws) {
    let s = stage(Noise::Gaussian { std: 0.5, draws });
    let whole = flat(&s.apply(batch(100, 0, 0)).unwrap());
    let b = batch(100, 0, 0);
    let mut split = flat(&s.apply(b.slice(0, 37)).unwrap());
    split.extend(flat(&s.apply(b.slice(37, 63)).unwrap()));
    assert_eq!(whole, split);
    // Another epoch, another draw; the same epoch again, the same draw.
    let again = flat(&s.apply(batch(100, 0, 0)).unwrap());
    assert_eq!(whole, again);
    let next_epoch = flat(&s.apply(batch(100, 0, 1)).unwrap());
    assert_ne!(whole, next_epoch);
}

#[test]
fn gaussian_noise_has_the_requested_spread() {
    for draws in [Draws::ChaCha8, Draws::SplitMix64, Draws::Ars] {
        gaussian_noise_has_the_requested_spread_with(draws);
    }
}

/// Version 1 draws what ChaCha8 on the row's stream gives (what every older Sluice drew);
/// versions 2 and 3 draw other values, from the row's SplitMix64 and ARS streams.
#[test]
fn each_draws_version_draws_from_its_own_generator() {
    use super::super::normal::{Counter, noise_row_f32, noise_row_f32_at};
    let input = batch(50, 3, 1);
    let ids = row_ids(&input.lineage);
    let key = column_key(7, 0, "x");
    let before = flat(&input);
    let mut want = [before.clone(), before.clone(), before];
    let mut scratch = Vec::new();
    let mut rng = ChaCha8Rng::from_seed(key);
    let k = u64::from_le_bytes(key[..8].try_into().unwrap());
    for (r, id) in ids.iter().enumerate() {
        let span = 4 * r..4 * r + 4;
        rng.set_stream(*id);
        noise_row_f32(&mut rng, &mut want[0][span.clone()], 0.5, &mut scratch);
        for (c, counter) in [Counter::SplitMix64, Counter::Ars].into_iter().enumerate() {
            let row = &mut want[c + 1][span.clone()];
            noise_row_f32_at(counter, splitmix64(k ^ id), row, 0.5, &mut scratch);
        }
    }
    for (want, draws) in want
        .iter()
        .zip([Draws::ChaCha8, Draws::SplitMix64, Draws::Ars])
    {
        let s = stage(Noise::Gaussian { std: 0.5, draws });
        assert_eq!(&flat(&s.apply(input.clone()).unwrap()), want, "{draws:?}");
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        assert!(want[a].iter().zip(&want[b]).all(|(x, y)| x != y), "{a} {b}");
    }
}

fn gaussian_noise_has_the_requested_spread_with(draws: Draws) {
    let s = stage(Noise::Gaussian { std: 0.1, draws });
    let input = batch(25_000, 0, 0);
    let before = flat(&input);
    let after = flat(&s.apply(input).unwrap());
    let d: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(a, b)| (*b - *a) as f64)
        .collect();
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let std = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    assert!(mean.abs() < 0.003, "mean {mean}");
    assert!((std - 0.1).abs() < 0.003, "std {std}");
}

#[test]
fn dropout_zeroes_about_p_and_scales_the_rest_exactly() {
    let s = stage(Noise::Dropout {
        p: 0.25,
        scale: 1.0 / 0.75,
    });
    let input = batch(10_000, 5, 0);
    let before = flat(&input);
    let after = flat(&s.apply(input).unwrap());
    let mut zeros = 0;
    for (a, b) in before.iter().zip(&after) {
        if *b == 0.0 && *a != 0.0 {
            zeros += 1;
        } else {
            assert_eq!(*b, *a * (1.0f64 / 0.75) as f32);
        }
    }
    let frac = zeros as f64 / before.len() as f64;
    assert!((frac - 0.25).abs() < 0.01, "{frac}");
}

/// Dropout never turns NaN into a number: a dropped NaN stays NaN (a kept one too); a
/// dropped ±inf becomes 0 like any dropped value, a kept one stays ±inf.
#[test]
fn dropout_keeps_nan_and_drops_inf_to_zero() {
    let s = stage(Noise::Dropout { p: 0.5, scale: 2.0 });
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
    let n = 2_000;
    let values = Float32Array::from_iter_values((0..n * 4).map(|i| special[i % 4]));
    let input = batch(n, 0, 0);
    let field = Arc::new(Field::new("item", DataType::Float32, true));
    let x = FixedSizeListArray::try_new(field, 4, Arc::new(values), None).unwrap();
    let data = RecordBatch::try_new(input.data.schema(), vec![Arc::new(x)]).unwrap();
    let after = flat(&s.apply(Batch::new(data, input.lineage.clone())).unwrap());
    let (mut dropped_inf, mut kept_inf) = (0, 0);
    for (i, v) in after.iter().enumerate() {
        match i % 4 {
            0 => assert!(v.is_nan(), "value {i}: NaN became {v}"),
            1 | 2 if *v == 0.0 => dropped_inf += 1,
            1 | 2 => {
                assert_eq!(*v, special[i % 4], "value {i}");
                kept_inf += 1;
            }
            _ => assert!(*v == 0.0 || *v == 2.0, "value {i}: {v}"),
        }
    }
    assert!(
        dropped_inf > 1_500 && kept_inf > 1_500,
        "{dropped_inf} {kept_inf}"
    );
}
